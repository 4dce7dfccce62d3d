"""End to end on real parts: the embedded engine with the real model, PostgreSQL, Redis,
real Celery worker processes (killed with SIGKILL mid-run), the rlgate CLI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from core.db import make_engine, session_factory
from core.migrate import upgrade
from core.settings import Settings, get_settings
from schemas.tables import AuditEventRow, InteractionRow, PolicyVersionRow, TrainingRunRow
from tests.servers import REPO, engine_cmd, free_port, running
from tests.trainer.helpers import MODEL_DIR, greedy, make_project, record, rewards, set_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TRAINING = {
    "lr": 5e-3,
    "max_staleness": 0,
    "threshold": 1000,
    "heartbeat_s": 1.0,
    "stale_after_s": 120.0,
    "lora_rank": 4,
    "lora_alpha": 8,
    "kl_coef": 0.01,
    "micro_batch_tokens": 256,
    "num_minibatches": 2,
    "kl_prox_target": None,  # lr 5e-3 moves far: every step runs (test_guard_e2e.py: the stop)
}


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(
        port,
        "--max-lora-rank",
        "16",
        "--max-loaded-loras",
        "4",
        "--context-length",
        "512",
        "--max-running-requests",
        "4",
    )
    with running(cmd, {}, log, port) as p:
        yield p.url


def _env(tmp_path: Path, db_url: str, engine_url: str, **extra: str) -> dict[str, str]:
    return {
        "RLGATE_DATA_DIR": str(tmp_path / "data"),
        "RLGATE_DATABASE_URL": db_url,
        "RLGATE_ENGINE_URLS": engine_url,
        "RLGATE_MODEL_PATH": str(MODEL_DIR),
        "RLGATE_LOG_LEVEL": "info",
        **extra,
    }


def _use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    return get_settings()


def _wait_run(factory, run_id: str, statuses: tuple[str, ...], timeout: float = 240):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with factory() as db:
            run = db.get(TrainingRunRow, run_id)
            # trained-not-published without an error is the moment before publishing
            pending = run is not None and run.status == "trained-not-published" and not run.error
            if run is not None and run.status in statuses and not pending:
                return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not reach {statuses}: {run and run.status}")


class Worker:
    def __init__(self, env: dict[str, str], queue: str, log: Path) -> None:
        self.log = log
        code = "from trainer.cli import worker_command; worker_command()"
        self.fh = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--queues", queue, "--pool", "solo"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=self.fh,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while b"ready." not in log.read_bytes():
            assert self.proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.fh.close()


def _loaded(engine_url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{engine_url}/v1/models").json()["data"][1:]}


def test_worker_trains_publishes_survives_sigkill_and_rolls_back(
    engine_url: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import runs
    from trainer.celery_base import make_celery
    from trainer.cli import adapters_group

    upgrade(pg_url)
    factory = session_factory(make_engine(pg_url))
    queue = f"rlgate-test-{secrets.token_hex(4)}"
    broker = "redis://127.0.0.1:6379/0"
    env = _env(tmp_path, pg_url, engine_url, RLGATE_BROKER_URL=broker)
    settings = _use_env(monkeypatch, env)
    producer = make_celery(settings)
    pid = make_project(factory, TRAINING)

    def send(run_id: str) -> None:
        producer.send_task("rlgate.train_project", args=[pid, "manual", run_id], queue=queue)

    # data from the base model: two groups of 2, one greedy singleton (T = 0), one aborted
    first = record(factory, engine_url, pid, "What is 2+2?", [1.0, -1.0])
    first += record(factory, engine_url, pid, "Name a color.", [0.5, -0.5])
    first += record(factory, engine_url, pid, "Say hi.", [0.8], temperature=0.0)
    aborted = record(factory, engine_url, pid, "Pick a fruit.", [1.0], finish_override="abort")
    base_out = greedy(engine_url, "Count to three.", None)

    worker = Worker(env, queue, tmp_path / "worker1.log")
    try:
        run1 = runs.create_queued(factory, pid, "manual")
        send(run1)
        run = _wait_run(factory, run1, ("published", "failed", "trained-not-published"))
        assert run.status == "published", (run.error, worker.log.read_text()[-3000:])
        assert run.num_samples == 5 and len(run.step_metrics) == 2
        step = run.step_metrics[0]
        for key in (
            "loss",
            "reward_mean",
            "adv_std",
            "clip_frac",
            "iw_mean",
            "masked_frac",
            "kl",
            "grad_norm",
            "tokens_per_s",
        ):
            assert key in step, step
        send(run1)  # a redelivered task for a finished run does nothing
        with factory() as db:
            v1 = db.scalars(
                select(PolicyVersionRow).where(PolicyVersionRow.project_id == pid)
            ).one()
            assert (v1.status, v1.version, v1.name) == ("serving", 1, f"{pid}-policy-v1")
            assert (Path(v1.path) / "adapter_model.safetensors").is_file()
            assert (Path(v1.path) / "optimizer.pt").is_file()
            consumed = {
                i.id: i.consumed_by_run_id
                for i in db.scalars(select(InteractionRow).where(InteractionRow.project_id == pid))
            }
        assert all(consumed[i] == run1 for i in first) and consumed[aborted[0]] is None
        assert v1.name in _loaded(engine_url)
        new_out = greedy(engine_url, "Count to three.", v1.name)
        base_lp = [x[0] for x in base_out["meta_info"]["output_token_logprobs"]]
        new_lp = [x[0] for x in new_out["meta_info"]["output_token_logprobs"]]
        assert new_lp != base_lp

        # next data: v1 samples (fresh) and one base sample (stale: lags 1 > max_staleness 0)
        second = record(factory, engine_url, pid, "Name a color.", [1.0, -1.0], adapter=v1.name)
        stale = record(factory, engine_url, pid, "Say hi.", [1.0, 0.0])
        set_training(factory, pid, step_delay_s=60.0)
        run2 = runs.create_queued(factory, pid, "manual")
        send(run2)
        _wait_run(factory, run2, ("running",))
        time.sleep(3)  # inside the (delayed) optimizer step
        worker.stop(signal.SIGKILL)
    finally:
        worker.stop()

    # serving continues on v1, nothing published, nothing consumed
    assert greedy(engine_url, "Count to three.", v1.name)["output_ids"]
    with factory() as db:
        assert db.get(TrainingRunRow, run2).status == "running"
        assert (
            len(
                db.scalars(select(PolicyVersionRow).where(PolicyVersionRow.project_id == pid)).all()
            )
            == 1
        )
        assert all(db.get(InteractionRow, i).consumed_by_run_id is None for i in second)

    set_training(factory, pid, step_delay_s=0.0)
    worker = Worker(env, queue, tmp_path / "worker2.log")
    try:
        run3 = runs.create_queued(factory, pid, "manual")
        send(run3)
        run = _wait_run(factory, run3, ("published", "failed", "trained-not-published"))
        assert run.status == "published", (run.error, worker.log.read_text()[-3000:])
    finally:
        worker.stop()
    with factory() as db:
        assert db.get(TrainingRunRow, run2).status == "failed"
        assert "worker lost" in db.get(TrainingRunRow, run2).error
        assert all(db.get(InteractionRow, i).consumed_by_run_id == run3 for i in second)
        assert all(db.get(InteractionRow, i).consumed_by_run_id is None for i in stale)
        assert run.config["data_stats"]["skipped_stale"] == 2
        v2 = db.scalars(
            select(PolicyVersionRow).where(
                PolicyVersionRow.version == 2, PolicyVersionRow.project_id == pid
            )
        ).one()
        assert v2.status == "serving" and v2.parent_name == v1.name
        assert v2.lora_config["warm_start"] == v1.path
        assert db.get(PolicyVersionRow, v1.id).status == "retired"
    loaded = _loaded(engine_url)
    assert v2.name in loaded and v1.name not in loaded  # the old version was unloaded

    # rollback through the CLI: v1 is loaded again and serves at once; v2 is left to the
    # background unload (a gateway's adapter sync or the trainer's tick), named as such
    cli = CliRunner()
    res = cli.invoke(adapters_group, ["rollback", "-p", pid, "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["unloading"] == v2.name, res.output
    assert v1.name in _loaded(engine_url)
    res = cli.invoke(adapters_group, ["list", "-p", pid], catch_exceptions=False)
    assert "v1    serving" in res.output and "v2    retired" in res.output, res.output
    with factory() as db:
        actions = [
            e.action
            for e in db.scalars(
                select(AuditEventRow)
                .where(AuditEventRow.project_id == pid)
                .order_by(AuditEventRow.created_at)
            )
        ]
    assert actions == ["adapter.promote", "adapter.promote", "adapter.rollback"]


def test_engine_refusal_leaves_run_trained_not_published_then_retry(
    engine_url: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded shape (SQLite), run in this process: an unreachable engine refuses."""
    from trainer import runner, serving_switch

    upgrade(sqlite_url)
    dead = f"http://127.0.0.1:{free_port()}"
    settings = _use_env(monkeypatch, _env(tmp_path, sqlite_url, dead))
    factory = serving_switch.db_factory(settings)
    pid = make_project(factory, {**TRAINING, "num_minibatches": 1, "aggregation": "seq-mean"})
    ids = record(factory, engine_url, pid, "What is 2+2?", [1.0, 0.0, -1.0])
    ids += record(factory, engine_url, pid, "Say hi.", [0.3])
    zero = record(factory, engine_url, pid, "Name a color.", [1.0, 1.0])  # zero variance
    result = runner.run_training(pid, "manual", settings=settings, factory=factory)
    assert result["status"] == "trained-not-published", result
    with factory() as db:
        run = db.get(TrainingRunRow, result["run_id"])
        assert "publish failed" in run.error and run.num_samples == 6
        assert run.config["data_stats"]["dropped_zero_variance_groups"] == 1
        pv = db.get(PolicyVersionRow, run.policy_version_id)
        assert pv.status == "candidate"
        assert all(db.get(InteractionRow, i).consumed_by_run_id == run.id for i in ids + zero)
    # baseline of the singleton's task is persisted
    with factory() as db:
        from schemas.tables import ProjectRow

        state = db.get(ProjectRow, pid).settings["trainer_state"]["baselines"]
        assert state["task-a"]["mean"] == pytest.approx(0.3)
    # the engine is back: the retry publishes
    settings = _use_env(monkeypatch, _env(tmp_path, sqlite_url, engine_url))
    assert serving_switch.retry_publish(settings, factory) == [pv.id]
    with factory() as db:
        assert db.get(PolicyVersionRow, pv.id).status == "serving"
        assert db.get(TrainingRunRow, result["run_id"]).status == "published"
    assert pv.name in _loaded(engine_url)
    # nothing left: a manual run is cancelled, a second call does not train either
    again = runner.run_training(pid, "manual", settings=settings, factory=factory)
    assert again["status"] == "cancelled"


def test_gateway_rate_train_serve_loop(
    engine_url: str,
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The product loop on real parts: calls through the gateway (PostgreSQL recording),
    ratings through POST /feedback, a run on a real Celery worker (Redis), and the next
    gateway response is served by, and recorded with, the new adapter. The worker runs it
    on 2 processes under torchrun (gloo, FSDP2; trainer/launch.py); the same loop on one
    process runs on SGLang (tests/trainer/test_e2e_sglang.py), and the one-process worker
    here in test_worker_trains_publishes_survives_sigkill_and_rolls_back."""
    processes = 2
    import openai

    from tests.servers import gateway
    from trainer import runs
    from trainer.celery_base import make_celery

    upgrade(pg_url)
    factory = session_factory(make_engine(pg_url))
    queue = f"rlgate-test-{secrets.token_hex(4)}"
    env = _env(
        tmp_path,
        pg_url,
        engine_url,
        RLGATE_BROKER_URL="redis://127.0.0.1:6379/0",
        RLGATE_TRAIN_PROCESSES=str(processes),
        RLGATE_TRAIN_BACKEND="gloo",
    )
    settings = _use_env(monkeypatch, env)
    pid = make_project(factory, TRAINING)
    from core.db import transaction
    from core.keys import create_key

    with transaction(factory) as db:
        _, key = create_key(db, pid, "agent")

    with gateway(tmp_path / "gw", pg_url, engine_url) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=120)
        rated = []
        for q in ("What is 2+2?", "Name a color."):
            resp = client.chat.completions.create(
                model="rlgate-policy",
                messages=[{"role": "user", "content": q}],
                n=2,
                temperature=1.0,
                max_tokens=8,
            )
            for i, value in ((0, 1), (1, 0)):  # one good, one bad answer per group
                r = httpx.post(
                    gw.url + "/feedback",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"interaction_id": f"{resp.id}.{i}", "value": value, "scale": "binary"},
                    timeout=30,
                )
                assert r.status_code == 200, r.text
                rated.append(f"{resp.id}.{i}")
        assert sorted(rewards(factory, rated).values()) == [-1.0, -1.0, 1.0, 1.0]

        worker = Worker(env, queue, tmp_path / "worker.log")
        try:
            run_id = runs.create_queued(factory, pid, "manual")
            make_celery(settings).send_task(
                "rlgate.train_project", args=[pid, "manual", run_id], queue=queue
            )
            run = _wait_run(factory, run_id, ("published", "failed", "trained-not-published"))
            assert run.status == "published", (run.error, worker.log.read_text()[-3000:])
        finally:
            worker.stop()
        assert run.config["data_stats"]["processes"] == processes
        assert len(run.step_metrics) == TRAINING["num_minibatches"]
        assert not (tmp_path / "data" / "train-runs").exists() or not any(
            (tmp_path / "data" / "train-runs").iterdir()
        )  # a run that worked leaves no work directory
        with factory() as db:
            name = db.get(PolicyVersionRow, run.policy_version_id).name
            consumed = db.scalars(
                select(InteractionRow.id).where(InteractionRow.consumed_by_run_id == run_id)
            ).all()
        assert set(consumed) == set(rated)

        time.sleep(0.6)  # the gateway's serving-pointer cache
        raw = client.chat.completions.with_raw_response.create(
            model="rlgate-policy", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
        )
        assert raw.headers["x-rlgate-policy-version"] == name
        new_id = raw.parse().id
        deadline = time.monotonic() + 20
        while True:
            with factory() as db:
                row = db.get(InteractionRow, new_id)
            if row is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert row is not None and row.policy_version == name
