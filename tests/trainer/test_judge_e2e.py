"""The LLM judge end to end, on PostgreSQL with real processes:

- the real local engine as the judge: the packaged base model behind an rlgate gateway,
  called through litellm with an agent key of another project. The model is tiny, so
  this asserts on the mechanics (a call was made and its answer parsed or counted as
  unparsable; the call was recorded in the judge's project, never in the judged one; a
  key of the judged project is refused), not on the quality of its judgement;
- gateway -> session closes -> a real ``rlgate worker`` runs the judge in its verify pool
  through litellm (``mock_response`` from RLGATE_JUDGE_MOCK_RESPONSE), as the operator's
  judge entry says -> feedback with rationale -> credit assignment -> the trainer's sample
  selection takes the judged interactions.
"""

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

import httpx
import pytest
from sqlalchemy import func, select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key, ensure_project
from core.migrate import upgrade
from core.settings import get_settings
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import FeedbackRow, InteractionRow, JudgeCallRow
from tests.grants import grant
from tests.rows import interaction, session
from tests.servers import REPO, Proc, engine_cmd, free_port, gateway, running
from trainer.data import select_samples
from trainer.hooks import run_verifiers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REDIS_DB = os.environ.get("RLGATE_TEST_JUDGE_REDIS_DB", "11")
BROKER = f"redis://127.0.0.1:6379/{REDIS_DB}"
# the operator's judge entry, in the gateway's and the worker's configuration
JUDGES = json.dumps({"mini": {"model": "openai/gpt-4o-mini"}})


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(port, "--context-length", "2048", "--max-running-requests", "4")
    with running(cmd, {}, log, port) as p:
        yield p


@pytest.fixture
def stack(pg_url: str, engine: Proc, tmp_path: Path) -> Iterator[tuple[Proc, Any]]:
    """A gateway on a fresh PostgreSQL database (Redis broker) and its session factory."""
    upgrade(pg_url)
    db = make_engine(pg_url)
    factory = session_factory(db)
    try:
        with gateway(tmp_path / "gw", pg_url, engine.url, broker_url=BROKER, judges=JUDGES) as gw:
            yield gw, factory
    finally:
        db.dispose()


def _count(factory: Any, project: str) -> int:
    with factory() as db:
        q = select(func.count()).select_from(InteractionRow)
        return int(db.scalar(q.where(InteractionRow.project_id == project)) or 0)


def test_the_local_engine_judges_through_the_gateway_with_another_projects_key(
    stack: tuple[Proc, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, factory = stack
    local = {
        "model": "openai/rlgate-policy",
        "api_base": gw.url + "/v1",
        "api_key_env": "RLGATE_JUDGE_KEY",
        "retries": 0,
        "timeout_s": 120,
    }
    grant(monkeypatch, judges={"local": local})
    spec = {"name": "judge", "judge": "local", "mode": "session", "max_tokens": 48}
    with transaction(factory) as db:
        ensure_project(db, "p1").settings = {"verifiers": [spec]}
        ensure_project(db, "judges")
        _, own_key = create_key(db, "p1", "agent")
        _, judge_key = create_key(db, "judges", "agent")
        db.add(to_row(session("s1", "p1", status="closed", closed_at=utcnow())))
        db.flush()
        db.add(to_row(interaction("s1-0", "s1", 0, "4", question="What is 2+2?")))

    # a key of the judged project: refused, nothing sent, nothing recorded
    monkeypatch.setenv("RLGATE_JUDGE_KEY", own_key)
    assert run_verifiers(factory, "s1") == []
    with factory() as db:
        assert db.scalars(select(JudgeCallRow.outcome)).all() == ["refused"]

    monkeypatch.setenv("RLGATE_JUDGE_KEY", judge_key)
    run_verifiers(factory, "s1")
    with factory() as db:
        calls = db.scalars(select(JudgeCallRow).order_by(JudgeCallRow.created_at)).all()
        fb = db.scalars(select(FeedbackRow)).all()
    assert [c.outcome for c in calls][0] == "refused" and len(calls) == 2
    real = calls[1]
    print(f"local judge: {real.outcome} in {real.latency_ms:.0f} ms; {real.error or ''}")
    assert real.outcome in ("ok", "unparsable"), real.error  # the call happened
    assert real.latency_ms is not None and real.model == "openai/rlgate-policy"
    if real.outcome == "ok":  # parsed: stored with the judge's model
        assert len(fb) == 1 and fb[0].judge_model == "openai/rlgate-policy"
        assert fb[0].source == "judge" and -1.0 <= fb[0].reward <= 1.0
    else:  # counted, no made-up score
        assert fb == [] and "answer:" in (real.error or "")
    deadline = time.monotonic() + 15  # the gateway records asynchronously
    while _count(factory, "judges") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _count(factory, "judges") == 1  # recorded in the judge's project
    assert _count(factory, "p1") == 1  # the judged project has only its own turn


@pytest.fixture
def worker(stack: tuple[Proc, Any], pg_url: str, tmp_path: Path) -> Iterator[Path]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RLGATE_DATABASE_URL": pg_url,
        "RLGATE_BROKER_URL": BROKER,
        "RLGATE_DATA_DIR": str(tmp_path / "worker-data"),
        "RLGATE_JUDGE_MOCK_RESPONSE": '{"score": 0.9, "rationale": "answered both questions"}',
        "RLGATE_JUDGES": JUDGES,
        "RLGATE_VERIFY_WORKERS": "1",
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(  # the trainer worker and its verify pool, as operators run it
            [sys.executable, "-m", "rlgate.cli", "worker",
             "-n", f"judge-test-{secrets.token_hex(3)}@%h"],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield log
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_gateway_session_close_judge_feedback_trainer_selection(
    stack: tuple[Proc, Any], worker: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    gw, factory = stack
    monkeypatch.setenv("RLGATE_DATABASE_URL", pg_url)
    monkeypatch.setenv("RLGATE_BROKER_URL", BROKER)
    get_settings.cache_clear()
    spec = {"name": "judge", "judge": "mini", "mode": "session", "rubric": "Correct?"}
    with transaction(factory) as db:
        ensure_project(db, "p1").settings = {"verifiers": [spec]}
        _, key = create_key(db, "p1", "agent")
    r = httpx.post(
        gw.url + "/v1/sessions",
        headers={"Authorization": f"Bearer {key}"},
        json={"task_id": "sums"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    sid, session_key = r.json()["id"], r.json()["api_key"]
    auth = {"Authorization": f"Bearer {session_key}"}
    messages: list[dict[str, Any]] = []
    for question in ("What is 2+2?", "And 3+3?"):
        messages.append({"role": "user", "content": question})
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers=auth,
            json={"messages": messages, "max_tokens": 8, "temperature": 0.7},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        messages.append(
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
        )
    end = httpx.post(f"{gw.url}/v1/sessions/{sid}/end", headers=auth, timeout=30)
    assert end.status_code == 200, end.text

    deadline = time.monotonic() + 120
    fb: list[FeedbackRow] = []
    while time.monotonic() < deadline:
        with factory() as db:
            fb = list(db.scalars(select(FeedbackRow).where(FeedbackRow.source == "judge")).all())
        if fb:
            break
        time.sleep(0.5)
    assert len(fb) == 1, worker.read_text()[-4000:]
    (f,) = fb
    assert (f.target_type, f.target_id, f.rater) == ("session", sid, "judge:session")
    assert (f.value, f.reward) == (0.9, pytest.approx(0.8))
    assert (f.rationale, f.judge_model) == ("answered both questions", "openai/gpt-4o-mini")

    def rewards() -> dict[str, float | None]:
        with factory() as db:
            q = select(InteractionRow.id, InteractionRow.reward)
            return dict(db.execute(q.where(InteractionRow.session_id == sid)).all())

    # the rating commits first, its credit assignment right after (trainer/hooks.py)
    deadline = time.monotonic() + 30
    while None in rewards().values() and time.monotonic() < deadline:
        time.sleep(0.2)
    with factory() as db:
        assert db.scalars(select(JudgeCallRow.outcome)).all() == ["ok"]
        picked = select_samples(db, "p1", max_staleness=10, max_samples=64, group_by_prompt=False)
    assigned = rewards()
    assert list(assigned.values()) == [pytest.approx(0.8)] * 2
    assert {s.interaction_id: s.reward for s in picked.samples} == assigned  # trainer takes them
    # the judge's feedback is served by the public API with its rationale and model
    admin = httpx.get(
        gw.url + "/v1/feedback",
        params={"session_id": sid},
        headers={"Authorization": f"Bearer {_admin_key(factory)}"},
        timeout=30,
    )
    assert admin.status_code == 200, admin.text
    (item,) = admin.json()["data"]
    assert item["rationale"] == "answered both questions"
    assert item["judge_model"] == "openai/gpt-4o-mini"


def _admin_key(factory: Any) -> str:
    with transaction(factory) as db:
        _, secret = create_key(db, "p1", "admin")
    return secret
