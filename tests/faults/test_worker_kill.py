"""A real Celery worker SIGKILLed in the middle of a training run: nothing is
half-published, and the samples are trained on by the next run (a restarted worker takes
the dead run over).

Real parts: PostgreSQL, Redis (broker), the embedded engine with the packaged model, two
worker processes started as `rlgate worker` starts them (tests/trainer/test_e2e.py's
Worker). ``step_delay_s`` holds the first run inside its optimizer step long enough to
kill it there.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory
from core.live_adapters import LIVE, live_path
from core.migrate import upgrade
from schemas.tables import InteractionRow, PolicyVersionRow, TrainingRunRow
from tests.trainer.helpers import greedy, make_project, record, set_training
from tests.trainer.test_e2e import (  # noqa: F401 - engine_url is a fixture
    TRAINING,
    Worker,
    _env,
    _loaded,
    _use_env,
    _wait_run,
    engine_url,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def _versions(factory, pid: str) -> list[PolicyVersionRow]:  # type: ignore[no-untyped-def]
    with factory() as db:
        q = select(PolicyVersionRow).where(PolicyVersionRow.project_id == pid)
        return list(db.scalars(q))


def _adapter_dirs(data_dir: Path, pid: str, sub: str = "") -> list[Path]:
    """A project's stored versions (``sub=""``) or its live directories (``sub=LIVE``)."""
    root = data_dir / "adapters" / pid / sub
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if not p.name.startswith(".") and p.name != LIVE)


def test_worker_sigkill_mid_run_publishes_nothing_and_next_run_reuses_samples(
    engine_url: str,  # noqa: F811
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer import runs
    from trainer.celery_base import make_celery

    upgrade(pg_url)
    factory = session_factory(make_engine(pg_url))
    queue = f"rlgate-faults-{secrets.token_hex(4)}"
    env = _env(tmp_path, pg_url, engine_url, RLGATE_BROKER_URL="redis://127.0.0.1:6379/0")
    settings = _use_env(monkeypatch, env)
    data_dir = Path(settings.data_dir)
    producer = make_celery(settings)
    pid = make_project(factory, {**TRAINING, "num_minibatches": 1, "step_delay_s": 60.0})
    samples = record(factory, engine_url, pid, "What is 2+2?", [1.0, -1.0])
    samples += record(factory, engine_url, pid, "Name a color.", [0.5, -0.5])

    def send(run_id: str) -> None:
        producer.send_task("rlgate.train_project", args=[pid, "manual", run_id], queue=queue)

    first = Worker(env, queue, tmp_path / "worker1.log")
    try:
        run1 = runs.create_queued(factory, pid, "manual")
        send(run1)
        claimed = _wait_run(factory, run1, ("running", "failed", "published"))
        assert claimed.status == "running", (claimed.error, first.log.read_text()[-2000:])
        time.sleep(5)  # loading the model or inside the (delayed) first optimizer step
        first.stop(signal.SIGKILL)
    finally:
        first.stop()

    # nothing published, nothing half-written, nothing consumed; serving is untouched
    assert _versions(factory, pid) == []
    assert _adapter_dirs(data_dir, pid) == []
    assert _adapter_dirs(data_dir, pid, LIVE) == []
    with factory() as db:
        assert db.get(TrainingRunRow, run1).status == "running"  # until someone takes over
        assert all(db.get(InteractionRow, i).consumed_by_run_id is None for i in samples)
    assert not any(n.startswith(pid) for n in _loaded(engine_url))
    assert greedy(engine_url, "Say hi.", None)["output_ids"]

    # a restarted worker takes the dead run over and trains on the same samples
    set_training(factory, pid, step_delay_s=0.0)
    second = Worker(env, queue, tmp_path / "worker2.log")
    try:
        run2 = runs.create_queued(factory, pid, "manual")
        send(run2)
        run = _wait_run(factory, run2, ("published", "failed", "trained-not-published"))
        assert run.status == "published", (run.error, second.log.read_text()[-3000:])
    finally:
        second.stop()
    with factory() as db:
        dead = db.get(TrainingRunRow, run1)
        assert dead.status == "failed" and "worker lost" in dead.error, dead.error
        assert dead.policy_version_id is None
        assert all(db.get(InteractionRow, i).consumed_by_run_id == run2 for i in samples)
    (v1,) = _versions(factory, pid)
    assert (v1.status, v1.version, v1.created_by_run_id) == ("serving", 1, run2)
    assert _adapter_dirs(data_dir, pid) == [Path(v1.path)]
    assert _adapter_dirs(data_dir, pid, LIVE) == [live_path(v1.path)]
    for f in ADAPTER_FILES:
        assert (Path(v1.path) / f).stat().st_size > 0, f
    assert v1.name in _loaded(engine_url)
    r = httpx.get(f"{engine_url}/v1/models", timeout=10)
    assert r.status_code == 200
