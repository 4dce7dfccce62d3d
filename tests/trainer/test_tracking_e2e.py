"""Run tracking on a real training run: the embedded engine with the real packaged model,
a run trained, gated (the eval gate on) and published in this process, as
``rlgate train --once`` and the worker's task run it (runner.run_training). With tracking
on, the run is in an MLflow store and in W&B's offline files, with the same step metrics as
the dashboard's run page (gateway/admin/training_queries.py ``run_detail``, what
/admin/runs/<id> and /admin/api/runs/<id> show). Trackers that fail leave the run
published and noted on that page."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.migrate import upgrade
from core.settings import Settings, get_settings
from gateway.admin.training_queries import STEP_METRICS, run_detail
from tests.servers import engine_cmd, free_port, running
from tests.trainer.helpers import MODEL_DIR, make_project, record
from tests.trainer.tracker_files import mlflow_run, tensorboard_run, wandb_runs, wandb_steps
from trainer import runner, serving_switch
from trainer.metrics import METRICS
from trainer.tracking import STEP_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TRAINING = {
    "lr": 5e-3,
    "max_staleness": 0,
    "threshold": 1000,
    "lora_rank": 4,
    "lora_alpha": 8,
    "micro_batch_tokens": 256,
    "num_minibatches": 2,
    "kl_prox_target": None,  # every step runs
    # the gate scores both adapters; margin 2 (scores are in [-1, 1]) lets any candidate pass
    "eval_gate": {
        "enabled": True,
        "verifier": "contains",
        "prompts": [{"prompt": "What is 2+2?", "expected": "4"}],
        "max_new_tokens": 4,
        "margin": 2.0,
    },
}


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(port, "--max-lora-rank", "8", "--context-length", "512")
    with running(cmd, {}, log, port) as p:
        yield p.url


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_url: str, **env: str):  # type: ignore[no-untyped-def]
    db_url = f"sqlite:///{tmp_path / 'rlgate.db'}"
    upgrade(db_url)
    values = {
        "RLGATE_DATA_DIR": str(tmp_path / "data"),
        "RLGATE_DATABASE_URL": db_url,
        "RLGATE_ENGINE_URLS": engine_url,
        "RLGATE_MODEL_PATH": str(MODEL_DIR),
        "RLGATE_PUBLIC_URL": "https://rlgate.example.test",
        **env,
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    settings = get_settings()
    return settings, serving_switch.db_factory(settings)


def _train(factory, engine_url: str, settings: Settings) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    pid = make_project(factory, TRAINING)
    record(factory, engine_url, pid, "What is 2+2?", [1.0, -1.0])
    record(factory, engine_url, pid, "Name a color.", [0.5, -0.5])
    result = runner.run_training(pid, "manual", settings=settings, factory=factory)
    assert result["status"] == "published", result
    with factory() as db:
        page = run_detail(db, None, result["run_id"])
    assert page is not None
    return {"pid": pid, **result, "page": page}


def _page_steps(page: dict[str, Any]) -> dict[str, dict[int, float]]:
    """The run page's step metrics, keyed as the trackers hold them."""
    out: dict[str, dict[int, float]] = {}
    for step in page["step_metrics"]:
        for m in METRICS:
            if isinstance(step.get(m.name), int | float):
                out.setdefault(STEP_PREFIX + m.name, {})[step["step"]] = float(step[m.name])
    return out


def test_a_tracked_run_is_in_mlflow_and_wandb_with_the_run_pages_metrics(
    engine_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, factory = _settings(
        monkeypatch,
        tmp_path,
        engine_url,
        RLGATE_TRACKERS="mlflow,wandb,tensorboard",
        RLGATE_MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        RLGATE_WANDB_MODE="offline",
    )
    run = _train(factory, engine_url, settings)
    page, run_id, pid = run["page"], run["run_id"], run["pid"]
    steps = _page_steps(page)
    n = page["steps"]
    assert n >= 2 and all(len(v) == n for v in steps.values())
    charted = {STEP_PREFIX + name for name, _ in STEP_METRICS}
    assert charted <= set(steps)
    # the charts' series are these same numbers
    for name, _ in STEP_METRICS:
        assert page["series"][name] == [steps[STEP_PREFIX + name][i + 1] for i in range(n)]
    assert page["config"]["tracking"]["warnings"] == []
    version = page["policy_version"]["name"]
    eval_new = page["eval_metrics"]["eval_new"]
    url = f"https://rlgate.example.test/admin/runs/{run_id}"

    mlflow, history = mlflow_run(settings.effective_mlflow_tracking_uri, f"{pid}/{run_id}")
    assert {k: v for k, v in history.items() if k.startswith(STEP_PREFIX)} == steps
    assert history["eval_new"] == {n: eval_new}
    tags = mlflow.data.tags
    assert (tags["project"], tags["run_id"], tags["base_version"]) == (pid, run_id, "base")
    assert (tags["outcome"], tags["published_version"]) == ("published", version)
    assert tags["rlgate.url"] == url and mlflow.info.status == "FINISHED"
    assert float(mlflow.data.params["lr"]) == TRAINING["lr"]

    (wb,) = wandb_runs(settings.effective_wandb_dir)
    assert wandb_steps(wb) == steps
    assert wb.name == f"{pid}/{run_id}" and {pid, run_id, "base"} <= set(wb.tags)
    assert wb.summary["published_version"] == version and wb.summary["eval_new"] == eval_new
    assert wb.config["lr"] == TRAINING["lr"] and url in wb.notes

    scalars, _ = tensorboard_run(settings.effective_tensorboard_dir / pid / run_id)
    for key, series in steps.items():
        assert scalars[key] == pytest.approx(series, rel=1e-6), key

    refs = page["config"]["tracking"]["trackers"]
    assert set(refs) == {"mlflow", "wandb", "tensorboard"}


def test_failing_trackers_do_not_fail_the_run_and_are_noted(
    engine_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow at a closed port (MLflow's own retries, as rlgate bounds them) and W&B whose
    package does not import: the run trains and publishes; its page says what failed."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    settings, factory = _settings(
        monkeypatch,
        tmp_path,
        engine_url,
        RLGATE_TRACKERS="wandb,mlflow",
        RLGATE_MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}",
    )
    run = _train(factory, engine_url, settings)
    tracking = run["page"]["config"]["tracking"]
    assert tracking["trackers"] == {}
    wandb_note, mlflow_note = tracking["warnings"]
    assert "wandb: not available" in wandb_note and "rlgate[wandb]" in wandb_note
    assert "mlflow: start failed" in mlflow_note
    assert run["page"]["error"] is None and run["page"]["steps"] >= 2
