"""The trackers of trainer/tracking.py, one class each: W&B, MLflow, TensorBoard, and
:func:`open_run`, which starts the configured ones (``RLGATE_TRACKERS``) on a run. Each
imports its package when it is made (``rlgate[wandb]``, ``rlgate[mlflow]``,
``rlgate[tensorboard]``); a missing package is noted on the run with the extra to install."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.serving_version import BASE, serving_version
from core.settings import Settings
from schemas.atdp import RunStatus
from schemas.tables import PolicyVersionRow, TrainingRunRow
from trainer import runs
from trainer.config import TrainConfig
from trainer.tracking import RUN_PAGE, Backend, Outcome, RunInfo, Tracking, eval_numbers

log = logging.getLogger("rlgate.trainer")

# MLflow's HTTP client retries a dead server for minutes by default; a tracker must not
# hold a run that long (the operator's own MLFLOW_HTTP_REQUEST_* settings win)
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
MLFLOW_BATCH = 100  # params per log_batch call (MLflow's limit)
MLFLOW_PARAM_CHARS = 6000


def make_backend(name: str, settings: Settings) -> Backend:
    makers = {"wandb": WandbTracker, "mlflow": MlflowTracker, "tensorboard": TensorBoardTracker}
    try:
        return makers[name](settings)
    except ImportError as e:
        raise ImportError(f"{e} (install it with: pip install 'rlgate[{name}]')") from e


def flat_config(config: dict[str, Any]) -> dict[str, str]:
    """The knobs as text: numbers and words as they are, lists and objects as JSON."""
    return {
        k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        for k, v in sorted(config.items())
    }


class WandbTracker:
    name = "wandb"

    def __init__(self, settings: Settings) -> None:
        import wandb

        self.wandb = wandb
        self.settings = settings
        self.run: Any = None

    def start(self, info: RunInfo) -> str:
        s = self.settings
        directory = s.effective_wandb_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(
            project=s.wandb_project,
            entity=s.wandb_entity or None,
            name=info.name,
            group=info.project_id,
            job_type="train",
            tags=[v[:64] for v in info.tags.values()],
            notes=f"rlgate run page: {info.url}",
            config={**info.config, "rlgate": {**info.tags, "url": info.url}},
            dir=str(directory),
            mode=s.wandb_mode or None,
            reinit="create_new",  # one W&B run per training run, whatever else the process runs
            settings=self.wandb.Settings(
                silent=True, console="off", x_disable_stats=True, disable_git=True
            ),
        )
        return str(self.run.url or self.run.dir)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def finish(self, outcome: Outcome) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        run.summary.update({**outcome.fields(), **outcome.eval_scores})
        run.finish(exit_code=1 if outcome.status == RunStatus.failed else 0)


class MlflowTracker:
    name = "mlflow"

    def __init__(self, settings: Settings) -> None:
        for k, v in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(k, v)
        from mlflow import MlflowClient

        self.uri = settings.effective_mlflow_tracking_uri
        if self.uri.startswith("sqlite:///"):  # a local store: its directory may not exist yet
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.experiment = settings.mlflow_experiment
        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id: str | None = None

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(self.experiment))
        except MlflowException:  # another worker created it meanwhile
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return str(found.experiment_id)

    def start(self, info: RunInfo) -> str:
        from mlflow.entities import Param

        tags = {**info.tags, "rlgate.url": info.url}
        tags["mlflow.note.content"] = f"rlgate run page: {info.url}"
        run = self.client.create_run(self._experiment_id(), run_name=info.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, v[:MLFLOW_PARAM_CHARS]) for k, v in flat_config(info.config).items()]
        for i in range(0, len(params), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + MLFLOW_BATCH])
        return f"{self.uri}#run={self.run_id}"

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)  # type: ignore[arg-type]

    def finish(self, outcome: Outcome) -> None:
        from mlflow.entities import Metric, RunTag

        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        now = int(time.time() * 1000)
        step = outcome.last_step
        metrics = [Metric(k, v, now, step) for k, v in outcome.eval_scores.items()]
        tags = [RunTag(k, v) for k, v in outcome.fields().items()]
        self.client.log_batch(run_id, metrics=metrics, tags=tags)
        status = {RunStatus.failed: "FAILED", RunStatus.cancelled: "KILLED"}
        self.client.set_terminated(run_id, status.get(outcome.status, "FINISHED"))


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", part) or "_"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, settings: Settings) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer_class = SummaryWriter
        self.root = Path(settings.effective_tensorboard_dir)
        self.writer: Any = None

    def start(self, info: RunInfo) -> str:
        log_dir = self.root / _safe(info.project_id) / _safe(info.run_id)
        self.writer = self.writer_class(log_dir=str(log_dir))
        lines = [f"- {k}: `{v}`" for k, v in info.tags.items()]
        self.writer.add_text("rlgate/run", "\n".join([*lines, f"- run page: {info.url}"]), 0)
        knobs = json.dumps(info.config, indent=2, sort_keys=True)
        self.writer.add_text("rlgate/config", "```\n" + knobs + "\n```", 0)
        self.writer.flush()
        return str(log_dir)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def finish(self, outcome: Outcome) -> None:
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        try:
            for k, v in outcome.eval_scores.items():
                writer.add_scalar(k, v, outcome.last_step)
            lines = [f"- {k}: `{v}`" for k, v in outcome.fields().items()]
            writer.add_text("rlgate/outcome", "\n".join(lines), outcome.last_step)
        finally:
            writer.close()


def open_run(settings: Settings, info: RunInfo) -> Tracking:
    """The configured trackers, each started on ``info`` (none: an empty fan-out)."""
    backends: list[Backend] = []
    warnings: list[str] = []
    for name in settings.tracker_list:
        try:
            backends.append(make_backend(name, settings))
        except Exception as e:  # the package is missing, or its settings are refused
            note = f"{name}: not available, not tracked: {type(e).__name__}: {e}"
            warnings.append(note[:1000])
            log.warning("run tracking: %s", note)
    tracking = Tracking(backends, warnings)
    tracking.start(info)
    return tracking


def run_url(settings: Settings, run_id: str) -> str:
    return settings.dashboard_url + RUN_PAGE.format(run_id=run_id)


def start_run(
    factory: sessionmaker[Session],
    settings: Settings,
    project_id: str,
    run_id: str,
    trigger: str,
    cfg: TrainConfig,
) -> Tracking:
    """trainer/runner.py, once a run is claimed: its tracked run on every configured
    tracker (none configured: an empty fan-out, nothing read). Never raises."""
    if not settings.tracker_list:
        return Tracking([])
    try:
        with factory() as db:
            serving = serving_version(db, project_id)
        base = serving.name if (serving is not None and cfg.warm_start) else BASE
        url = run_url(settings, run_id)
        return open_run(settings, RunInfo(project_id, run_id, base, trigger, cfg.snapshot(), url))
    except Exception as e:  # e.g. the database went away: the run's own code will say so
        log.warning("run %s: tracking not started: %s", run_id, e)
        return Tracking([], [f"tracking not started: {type(e).__name__}: {e}"[:1000]])


def finish_run(factory: sessionmaker[Session], tracking: Tracking, run_id: str) -> None:
    """trainer/runner.py, when the run is over (published or not): its outcome, as the
    run's row says, to each tracker; what tracking noted goes into ``config["tracking"]``.
    Never raises."""
    if not tracking.backends and not tracking.warnings:
        return
    try:
        tracking.finish(_outcome(factory, run_id, tracking.last_step))
    except Exception as e:  # the run's rows could not be read: the trackers are closed anyway
        tracking.warnings.append(f"outcome not read: {type(e).__name__}: {e}"[:1000])
        tracking.finish(Outcome(RunStatus.failed, error=str(e), last_step=tracking.last_step))
    try:
        runs.annotate(factory, run_id, "tracking", tracking.summary())
    except Exception as e:  # the notes are not worth failing the run over
        log.warning("run %s: could not store its tracking notes: %s", run_id, e)


def _outcome(factory: sessionmaker[Session], run_id: str, last_step: int) -> Outcome:
    with factory() as db:
        run = db.get(TrainingRunRow, run_id)
        if run is None:
            return Outcome(RunStatus.failed, error="the run's row is gone", last_step=last_step)
        pv = db.get(PolicyVersionRow, run.policy_version_id) if run.policy_version_id else None
        name = pv.name if pv is not None else None
        scores, notes = eval_numbers(pv.eval_metrics if pv is not None else None)
        published = name if run.status == RunStatus.published else None
        return Outcome(run.status, name, published, run.error, scores, notes, last_step)
