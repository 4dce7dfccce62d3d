"""Issue 26, finding 3: one project's judge cannot stall the others. On PostgreSQL with a
real ``rlgate worker`` (the trainer and its verify pool, as operators run it), project
p1's judge calls a listener that never answers while the test holds it. Meanwhile:

- project p2's verifier rating lands (its task gets the pool's other process: p1 holds at
  most RLGATE_VERIFY_PER_PROJECT=1 of them, its other sessions wait on the queue);
- a training run of project p3 runs to its end on the trainer's queue;
- the listener never sees two of p1's calls at once;
- a verify task found on the trainer's queue (queued before an upgrade) is moved to the
  verify pool instead of running the judge in the trainer.

Before the change, verification and training shared the one queue and the one slot of a
solo worker, so p2's rating and p3's run waited behind p1's judge (issue 26 measured
93 s instead of 1.5 s)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import ensure_project
from core.migrate import upgrade
from core.settings import get_settings
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import FeedbackRow, TrainingRunRow
from tests.rows import interaction, session
from tests.security.listener import Listener
from tests.servers import REPO
from trainer import api
from trainer.celery_base import make_celery
from trainer.hooks import VERIFY_TASK, on_session_closed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BROKER = f"redis://127.0.0.1:6379/{os.environ.get('RLGATE_TEST_ISOLATION_REDIS_DB', '12')}"


@pytest.fixture
def stall() -> Iterator[Listener]:
    """A judge endpoint that holds every call until released, then fails it."""
    with Listener(lambda _seen: (500, {"error": {"message": "too late"}}), hold=True) as server:
        yield server


def _until(what: Any, timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out; worker log:\n{log.read_text()[-4000:]}")


def test_a_stalled_judge_delays_neither_other_projects_ratings_nor_training(
    pg_url: str, stall: Listener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(pg_url)
    engine = make_engine(pg_url)
    factory = session_factory(engine)
    judges = json.dumps(
        {"stalled": {"model": "openai/j", "api_base": stall.url + "/v1", "timeout_s": 120,
                     "retries": 0, "projects": ["p1"]}}
    )  # fmt: skip
    settings = {
        "RLGATE_DATABASE_URL": pg_url,
        "RLGATE_BROKER_URL": BROKER,
        "RLGATE_JUDGES": judges,
        "RLGATE_VERIFY_WORKERS": "2",
        "RLGATE_VERIFY_PER_PROJECT": "1",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    spec = {"name": "judge", "judge": "stalled", "mode": "session"}
    with transaction(factory) as db:
        ensure_project(db, "p1").settings = {"verifiers": [spec]}
        ensure_project(db, "p2").settings = {"verifiers": ["contains"]}
        ensure_project(db, "p3")
        for i in range(3):
            db.add(to_row(session(f"p1-s{i}", "p1", status="closed", closed_at=utcnow())))
        db.add(to_row(session("p2-s", "p2", status="closed", metadata={"expected": "Paris"})))
        db.flush()
        for i in range(3):
            db.add(to_row(interaction(f"p1-s{i}-0", f"p1-s{i}", 0, "42", project_id="p1")))
        db.add(to_row(interaction("p2-s-0", "p2-s", 0, "It is Paris.", project_id="p2")))

    # a verify task queued on the trainer's queue (as one from before the verify queue
    # existed is, after an upgrade): the worker moves it to the verify pool, so it cannot
    # hold the trainer. The broker DB is this test's own: what a killed run left is dropped.
    redis.Redis.from_url(BROKER).flushdb()
    make_celery().send_task(VERIFY_TASK, args=["p1-s0"], queue="celery")

    log = tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLGATE_DATA_DIR": str(tmp_path / "w")}
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rlgate.cli", "worker", "-n", f"iso-{secrets.token_hex(3)}@%h"],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        for i in range(3):
            assert on_session_closed(factory, f"p1-s{i}") is True
        _until(lambda: stall.in_flight >= 1, 120, log)  # p1's judge is stuck

        assert on_session_closed(factory, "p2-s") is True
        run_id = api.train_now("p3", "test", factory=factory)

        def rated() -> list[FeedbackRow]:
            with factory() as db:
                q = select(FeedbackRow).where(FeedbackRow.project_id == "p2")
                return list(db.scalars(q).all())

        def finished() -> str | None:
            with factory() as db:
                status = db.get(TrainingRunRow, run_id).status  # type: ignore[union-attr]
            return None if status in ("queued", "running") else str(status)

        (fb,) = _until(rated, 90, log)
        assert (fb.source, fb.rater, fb.reward) == ("verifier", "contains", 1.0)
        assert _until(finished, 90, log) == "cancelled"  # p3 has nothing to train on
        # both landed while p1's judge still held its call, and p1 never had two
        assert not stall.release.is_set() and stall.in_flight == 1
        assert stall.most == 1 and len(stall.seen) == 1
        assert "moved to rlgate.verify" in log.read_text()  # the stray task went to the pool
    finally:
        stall.release.set()
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        engine.dispose()
