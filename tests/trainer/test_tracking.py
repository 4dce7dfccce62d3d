"""Run tracking (trainer/tracking.py, trainer/trackers.py) on the real trackers, offline:
MLflow with a SQLite store read back with its client, W&B in offline mode with its run
files read back, TensorBoard event files read back with TensorBoard's reader. No model:
the steps are made up here, with every metric of trainer/metrics.py (the real run is in
test_tracking_e2e.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from core.db import transaction
from core.settings import Settings
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow, ProjectRow, TrainingRunRow
from tests.servers import free_port
from tests.trainer.tracker_files import mlflow_run, tensorboard_run, wandb_runs, wandb_steps
from trainer import trackers
from trainer.config import TrainConfig
from trainer.metrics import METRICS
from trainer.tracking import STEP_PREFIX, Outcome, RunInfo, Tracking, step_metrics

URL = "https://rlgate.example.test"


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline with its own files under tmp_path; nothing from the developer's."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _settings(tmp_path: Path, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "trackers": "wandb,mlflow,tensorboard",
        "wandb_mode": "offline",
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "public_url": URL + "/",
    }
    return Settings(**{**values, **extra})


def _steps(n: int) -> list[dict[str, Any]]:
    """Steps as trainer/train.py makes them: every table metric, and keys outside it."""
    return [
        {
            "step": i + 1,
            "epoch": 0,
            **{m.name: 0.1 * (i + 1) + j / 100 for j, m in enumerate(METRICS)},
            "grad_norm": 9.0,  # not a trainer.metrics row: not tracked
            "stopped_early": False,
        }
        for i in range(n)
    ]


def _by_key(steps: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """{tracker key: {step: value}}, as the trackers should hold them."""
    out: dict[str, dict[int, float]] = {}
    for step in steps:
        for key, value in step_metrics(step).items():
            out.setdefault(key, {})[step["step"]] = value
    return out


def _same(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]]) -> None:
    assert set(got) == set(want)
    for key, series in want.items():
        assert got[key] == pytest.approx(series, rel=1e-6), key  # TensorBoard: float32


def _info(project: str = "proj", run_id: str = "run_abc") -> RunInfo:
    config = TrainConfig().snapshot()
    return RunInfo(project, run_id, "base", "manual", config, f"{URL}/admin/runs/{run_id}")


def test_settings_parse_and_refuse_trackers() -> None:
    assert Settings(trackers=" MLflow, wandb ,mlflow").tracker_list == ("mlflow", "wandb")
    assert Settings(trackers="none").tracker_list == ()
    assert Settings().tracker_list == ()
    for bad in ("comet", "none,wandb"):
        with pytest.raises(ValueError, match="trackers"):
            Settings(trackers=bad)
    s = Settings(gateway_host="10.0.0.2", gateway_port=8100)
    assert s.dashboard_url == "http://10.0.0.2:8100"
    masked = Settings(mlflow_tracking_uri="https://u:secret@mlflow.example.test").masked()
    assert "secret" not in masked["mlflow_tracking_uri"]


def test_step_metrics_are_the_metrics_table() -> None:
    step = _steps(1)[0]
    assert set(step_metrics(step)) == {STEP_PREFIX + m.name for m in METRICS}
    odd = step_metrics({"kl": float("nan"), "loss": True, "entropy": 1, "grad_norm": 2.0})
    assert set(odd) == {"train/kl", "train/entropy"} and odd["train/entropy"] == 1.0


def test_run_page_is_the_dashboards() -> None:
    """trainer/ cannot import the gateway: the link's path is checked against its routes."""
    from gateway.admin.pages import router
    from trainer.tracking import RUN_PAGE

    assert RUN_PAGE in {getattr(r, "path", "") for r in router.routes}


def test_every_tracker_gets_the_run_and_reads_back(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    info, steps = _info(), _steps(3)
    tracking = trackers.open_run(settings, info)
    assert [b.name for b in tracking.backends] == ["wandb", "mlflow", "tensorboard"]
    for step in steps:
        tracking.step(step)
    outcome = Outcome(
        "published",
        "proj-policy-v1",
        "proj-policy-v1",
        None,
        {"eval_new": 0.75, "eval_serving": 0.25},
        {"eval_verifier": "contains"},
        last_step=3,
    )
    tracking.finish(outcome)
    assert tracking.warnings == []
    expected = _by_key(steps)

    # MLflow: a SQLite store, read with MLflow's client
    run, history = mlflow_run(settings.effective_mlflow_tracking_uri, info.name)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["project"], tags["run_id"], tags["base_version"]) == ("proj", "run_abc", "base")
    assert tags["rlgate.url"] == f"{URL}/admin/runs/run_abc"
    assert (tags["outcome"], tags["published_version"]) == ("published", "proj-policy-v1")
    assert tags["eval_verifier"] == "contains"
    assert run.data.params["lr"] == str(TrainConfig().lr)
    assert set(run.data.params) == set(info.config)
    _same({k: history[k] for k in expected}, expected)
    assert history["eval_new"] == {3: 0.75}
    assert "train/grad_norm" not in history

    # W&B: the offline run's own file
    (wb,) = wandb_runs(settings.effective_wandb_dir)
    assert wb.name == "proj/run_abc" and {"proj", "run_abc", "base"} <= set(wb.tags)
    assert f"{URL}/admin/runs/run_abc" in wb.notes
    assert wb.config["lr"] == TrainConfig().lr
    assert wb.config["rlgate"]["url"] == f"{URL}/admin/runs/run_abc"
    _same(wandb_steps(wb), expected)
    assert wb.summary["outcome"] == "published" and wb.summary["eval_new"] == 0.75
    assert wb.summary["published_version"] == "proj-policy-v1"
    assert wb.exit_code == 0

    # TensorBoard: event files under <dir>/<project>/<run id>
    scalars, texts = tensorboard_run(settings.effective_tensorboard_dir / "proj" / "run_abc")
    _same({k: scalars[k] for k in expected}, expected)
    assert scalars["eval_new"] == pytest.approx({3: 0.75})
    assert "run_abc" in texts["rlgate/run"][0] and "/admin/runs/run_abc" in texts["rlgate/run"][0]
    assert '"lr"' in texts["rlgate/config"][0]
    assert "published_version: `proj-policy-v1`" in texts["rlgate/outcome"][0]


def test_failing_trackers_are_noted_and_the_rest_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow at a closed port, W&B whose package does not import: both noted; TensorBoard
    still gets every step."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    dead = f"http://127.0.0.1:{free_port()}"
    settings = _settings(tmp_path, mlflow_tracking_uri=dead)
    tracking = trackers.open_run(settings, _info())
    for step in _steps(2):
        tracking.step(step)
    tracking.finish(Outcome("published", last_step=2))
    assert [b.name for b in tracking.backends] == ["tensorboard"]
    wandb_note, mlflow_note = tracking.warnings
    assert wandb_note.startswith("wandb: not available") and "rlgate[wandb]" in wandb_note
    assert mlflow_note.startswith("mlflow: start failed") and "127.0.0.1" in mlflow_note
    scalars, _ = tensorboard_run(settings.effective_tensorboard_dir / "proj" / "run_abc")
    assert set(scalars["train/loss"]) == {1, 2}


def test_a_diverged_step_is_logged_as_nan(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    tracking = trackers.open_run(settings, _info())
    tracking.step({"step": 1, "loss": float("nan"), "kl": float("inf")})
    tracking.finish(Outcome("failed", error="loss is NaN", last_step=1))
    assert tracking.warnings == [] and len(tracking.backends) == 3
    _, history = mlflow_run(settings.effective_mlflow_tracking_uri, "proj/run_abc")
    assert math.isnan(history["train/loss"][1])
    assert history["train/kl"][1] >= 1e308  # MLflow stores inf as the largest float
    scalars, _ = tensorboard_run(settings.effective_tensorboard_dir / "proj" / "run_abc")
    assert math.isnan(scalars["train/loss"][1])
    (wb,) = wandb_runs(settings.effective_wandb_dir)
    assert math.isnan(wandb_steps(wb)["train/loss"][1]) and wb.exit_code == 1


class _Flaky:
    """A tracker that breaks on its second step."""

    name = "flaky"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.finished: list[str] = []

    def start(self, info: RunInfo) -> str:
        return "here"

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        if step == 2:
            raise ConnectionError("server went away")
        self.steps.append(step)

    def finish(self, outcome: Outcome) -> None:
        self.finished.append(outcome.status)


def test_a_tracker_failing_mid_run_is_dropped_once() -> None:
    flaky, steady = _Flaky(), _Flaky()
    steady.name = "steady"
    steady.log_step = lambda step, metrics: steady.steps.append(step)  # type: ignore[method-assign]
    tracking = Tracking([flaky, steady])
    tracking.start(_info())
    for step in _steps(3):
        tracking.step(step)
    tracking.finish(Outcome("published"))
    assert flaky.steps == [1] and flaky.finished == ["tracking-failed"]
    assert steady.steps == [1, 2, 3] and steady.finished == ["published"]
    assert tracking.summary() == {
        "trackers": {"flaky": "here", "steady": "here"},
        "warnings": [
            "flaky: logging a step failed, not tracked from here on: "
            "ConnectionError: server went away"
        ],
    }


def test_the_runs_outcome_and_notes_come_from_its_rows(
    migrated_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """start_run / finish_run as runner.run_training calls them: the base version from the
    serving one, the outcome and eval scores from the run's rows, notes into its config."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    settings = _settings(tmp_path, trackers="wandb,tensorboard")
    now = utcnow()

    def version(v: int, status: str, **extra: Any) -> PolicyVersionRow:
        return PolicyVersionRow(
            id=f"pv{v}",
            project_id="proj",
            name=f"proj-policy-v{v}",
            version=v,
            base_model="m",
            path="/nowhere",
            lora_config={},
            status=status,
            created_at=now,
            **extra,
        )

    with transaction(migrated_db) as db:
        db.add(ProjectRow(id="proj", name="proj", settings={}))
        db.add(TrainingRunRow(id="run_1", project_id="proj", trigger="manual", created_at=now))
        db.flush()
        db.add(version(1, "serving", promoted_at=now))
        gate = {"eval_new": 0.5, "eval_verifier": "contains"}
        db.add(version(2, "candidate", created_by_run_id="run_1", eval_metrics=gate))
    tracking = trackers.start_run(migrated_db, settings, "proj", "run_1", "manual", TrainConfig())
    for step in _steps(2):
        tracking.step(step)
    with transaction(migrated_db) as db:
        run = db.get(TrainingRunRow, "run_1")
        run.status, run.policy_version_id, run.config = "published", "pv2", {"kept": 1}
    trackers.finish_run(migrated_db, tracking, "run_1")
    with migrated_db() as db:
        config = db.get(TrainingRunRow, "run_1").config
    assert config["kept"] == 1
    assert config["tracking"]["trackers"] == {
        "tensorboard": str(settings.effective_tensorboard_dir / "proj" / "run_1")
    }
    (note,) = config["tracking"]["warnings"]
    assert note.startswith("wandb: not available")
    scalars, texts = tensorboard_run(settings.effective_tensorboard_dir / "proj" / "run_1")
    assert scalars["eval_new"] == pytest.approx({2: 0.5})
    assert "base_version: `proj-policy-v1`" in texts["rlgate/run"][0]  # warm start
    outcome = texts["rlgate/outcome"][0]
    assert "outcome: `published`" in outcome and "published_version: `proj-policy-v2`" in outcome


def test_no_trackers_nothing_is_written(migrated_db, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path / "data")
    tracking = trackers.start_run(migrated_db, settings, "proj", "run_x", "manual", TrainConfig())
    assert tracking.backends == [] and tracking.warnings == []
    trackers.finish_run(migrated_db, tracking, "run_x")  # no row, no query: nothing to note
    assert not (tmp_path / "data").exists()
