"""Acceptance: a collapse driven on purpose is caught by the guards and rolled back, on
real parts: PostgreSQL, a real Celery worker (Redis broker), the embedded engine with the
real packaged model.

v1 serves and is rated well; v2 (trained from v1) serves and its answers are rated badly
(rewards that go bad for a version, as a verifier rewarding one constant answer and then
switching would). The next run's guard check finds v2 worse than v1 (one-sided Welch
test), re-serves v1 through the rollback path (audit ``adapter.rollback``, actor
``guard``, reason ``guard:reward``), logs a WARNING, skips v2's samples, and the run after
that trains from v1's weights.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory
from core.live_adapters import live_path
from core.migrate import upgrade
from schemas.tables import AuditEventRow, PolicyVersionRow, TrainingRunRow
from tests.trainer.helpers import make_project, record
from tests.trainer.test_e2e import Worker, _env, _use_env, _wait_run
from tests.trainer.test_e2e import engine_url as engine_url  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TRAINING = {
    "lr": 5e-3,
    "max_staleness": 0,
    "threshold": 1000,
    "lora_rank": 4,
    "lora_alpha": 8,
    "micro_batch_tokens": 256,
    "num_minibatches": 2,
    "heartbeat_s": 1.0,
    "guard_min_samples": 4,
}
QUESTIONS = ["What is 2+2?", "Name a color.", "Say hi.", "Pick a fruit."]


def test_guard_rolls_back_a_worse_version_and_training_restarts_from_the_best(
    engine_url: str,  # noqa: F811
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer import runs
    from trainer.celery_base import make_celery
    from trainer.publish import sync_engines

    upgrade(pg_url)
    factory = session_factory(make_engine(pg_url))
    queue = f"rlgate-test-{secrets.token_hex(4)}"
    env = _env(tmp_path, pg_url, engine_url, RLGATE_BROKER_URL="redis://127.0.0.1:6379/0")
    producer = make_celery(_use_env(monkeypatch, env))
    pid = make_project(factory, TRAINING)

    def run_on_worker(worker: Worker) -> TrainingRunRow:
        run_id = runs.create_queued(factory, pid, "manual")
        producer.send_task("rlgate.train_project", args=[pid, "manual", run_id], queue=queue)
        return _wait_run(
            factory, run_id, ("published", "failed", "trained-not-published", "cancelled")
        )

    def rate(adapter: str | None, rewards: list[list[float]]) -> None:
        for q, r in zip(QUESTIONS, rewards, strict=True):
            record(factory, engine_url, pid, q, r, adapter=adapter)  # type: ignore[arg-type]

    def version(n: int) -> PolicyVersionRow:
        with factory() as db:
            return db.scalars(
                select(PolicyVersionRow).where(
                    PolicyVersionRow.project_id == pid, PolicyVersionRow.version == n
                )
            ).one()

    worker = Worker(env, queue, tmp_path / "worker.log")
    try:
        rate(None, [[1.0, -1.0], [0.5, -0.5], [1.0, 0.0], [0.0, -1.0]])
        assert run_on_worker(worker).status == "published"
        v1 = version(1)
        rate(v1.name, [[1.0, 0.5], [1.0, 0.0], [0.5, 0.0], [1.0, -0.5]])  # v1 is good
        run2 = run_on_worker(worker)
        assert run2.status == "published", (run2.error, worker.log.read_text()[-3000:])
        v2 = version(2)
        assert v2.parent_name == v1.name
        # v2 collapses: its answers are rated badly
        rate(v2.name, [[-1.0, -1.0], [-1.0, -0.5], [-0.5, -1.0], [-1.0, -1.0]])
        run3 = run_on_worker(worker)  # the guard acts before training
        # nothing left to train on: v1's samples were used, v2's are skipped (rolled back)
        assert run3.status == "cancelled", (run3.error, worker.log.read_text()[-3000:])
        assert run3.config["data_stats"]["skipped_rolled_back"] == 8
        assert run3.config["data_stats"]["guard"]["reason"] == "guard:reward"
        assert version(1).status == "serving" and version(2).status == "retired"
        # the guard did not wait for v2's unload (issue 38): its live directory is gone
        # (no engine can re-load it), and the tick's engine sync (or a gateway's adapter
        # sync, once no request of its own uses v2) unloads it
        assert not live_path(v2.path).exists()
        sync_engines(factory, [engine_url])
        loaded = {m["id"] for m in httpx.get(f"{engine_url}/v1/models").json()["data"][1:]}
        assert v1.name in loaded and v2.name not in loaded

        rate(v1.name, [[1.0, 0.0], [0.5, -0.5], [1.0, -1.0], [0.0, 0.5]])  # v1 serves again
        run4 = run_on_worker(worker)
        assert run4.status == "published", (run4.error, worker.log.read_text()[-3000:])
    finally:
        worker.stop()
    log = worker.log.read_text()
    assert "WARNING" in log and "GUARD reward tripped" in log
    assert f"rolling back to {v1.name}" in log

    v3 = version(3)  # trained from v1's weights, not from the collapsed v2
    assert v3.status == "serving" and v3.parent_name == v1.name
    assert v3.lora_config["warm_start"] == v1.path
    with factory() as db:
        events = db.scalars(
            select(AuditEventRow)
            .where(AuditEventRow.project_id == pid)
            .order_by(AuditEventRow.created_at)
        ).all()
    assert [e.action for e in events] == [
        "adapter.promote",
        "adapter.promote",
        "adapter.rollback",
        "adapter.promote",
    ]
    rollback = events[2]
    assert rollback.actor == "guard" and rollback.target_id == v1.id
    d = rollback.details
    assert d["reason"] == "guard:reward" and d["rolled_back"] == v2.name
    assert d["previous"] == v2.name and d["p_value"] < 0.01
    assert d["serving_stats"]["mean_reward"] < d["best_stats"]["mean_reward"] - 0.5
    assert d["serving_stats"]["zero_variance_groups"] == 2

    # per-run metrics: trust region, KL to base, entropy, zero-variance share, masked split
    summary = run2.config["data_stats"]["run_metrics"]
    for key in ("entropy", "kl", "kl_prox", "zero_variance_share", "masked_stale_frac"):
        assert summary[key] is not None, summary
    last = run2.step_metrics[-1]
    if last.get("stopped_early"):  # the trust region stopped the run before step 2
        assert len(run2.step_metrics) == 1 and last["stop_kl_prox"] > 0.02
    else:
        assert len(run2.step_metrics) == 2 and last["kl_prox"] > 0
    assert last["entropy"] > 0
    assert "masked_stale_frac" in last and "masked_mismatch_frac" in last
