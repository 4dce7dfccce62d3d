"""Run tracking: each training run also logged to the operator's experiment trackers
(``RLGATE_TRACKERS``: wandb, mlflow, tensorboard). This module is the run's side: what a
run sends, the fan-out, the notes; trainer/trackers.py holds the backends (each behind its
extra, e.g. ``rlgate[mlflow]``) and ``open_run``.

A tracked run is named ``<project>/<run id>`` and tagged with the project, the run id, the
base version it trains from and its trigger. It logs the run's knobs (the config snapshot
the run stores), each step's metrics (every row of trainer/metrics.py ``METRICS`` a step
holds, as ``train/<name>``), the eval gate's scores, the outcome and the published version,
and links to the run's dashboard page.

Tracking never fails a run: a backend that cannot be imported, reached or written is
dropped from that run at its first error, logged, and noted in the run's
``config["tracking"]["warnings"]`` (shown on the dashboard's run page). Destinations come
from the operator's settings only (core/settings.py), never from a project's settings.
Torch-free; a backend's package is imported only when it is configured.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainer.metrics import METRICS

log = logging.getLogger("rlgate.trainer")

RUN_PAGE = "/admin/runs/{run_id}"  # the dashboard's run page (gateway/admin/pages.py)
STEP_PREFIX = "train/"  # a step metric's key in the trackers: train/<trainer.metrics name>
STEP_NAMES = tuple(m.name for m in METRICS)


@dataclass(frozen=True)
class RunInfo:
    project_id: str
    run_id: str
    base_version: str
    trigger: str
    config: dict[str, Any]  # the knobs (TrainConfig.snapshot())
    url: str  # the run's dashboard page

    @property
    def name(self) -> str:
        return f"{self.project_id}/{self.run_id}"

    @property
    def tags(self) -> dict[str, str]:
        return {
            "project": self.project_id,
            "run_id": self.run_id,
            "base_version": self.base_version,
            "trigger": self.trigger,
        }


@dataclass(frozen=True)
class Outcome:
    status: str  # the run's final status (published, trained-not-published, failed, ...)
    version: str | None = None  # the version the run trained, if any
    published_version: str | None = None  # that version, when it was published
    error: str | None = None
    eval_scores: dict[str, float] = field(default_factory=dict)  # the eval gate's numbers
    eval_notes: dict[str, str] = field(default_factory=dict)  # its verifier, error, ...
    last_step: int = 0

    def fields(self) -> dict[str, str]:
        """The outcome as text fields (tags, summary entries)."""
        out = {"outcome": self.status, "version": self.version or ""}
        out["published_version"] = self.published_version or ""
        if self.error:
            out["error"] = self.error[:2000]
        return {**out, **self.eval_notes}


class Backend(Protocol):
    """One tracker. Any method may raise: the backend is then dropped from the run."""

    name: str

    def start(self, info: RunInfo) -> str: ...  # returns where the run is (id, directory)

    def log_step(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self, outcome: Outcome) -> None: ...


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def step_metrics(step: dict[str, Any]) -> dict[str, float]:
    """A step's metrics as the trackers get them: each trainer.metrics row the step holds
    as a number (NaN too: a diverged step shows as one), keyed ``train/<name>``."""
    return {STEP_PREFIX + n: float(step[n]) for n in STEP_NAMES if _number(step.get(n))}


def eval_numbers(metrics: dict[str, Any] | None) -> tuple[dict[str, float], dict[str, str]]:
    """The eval gate's metrics (PolicyVersionRow.eval_metrics) as (numbers, text)."""
    numbers, notes = {}, {}
    for k, v in (metrics or {}).items():
        if _number(v):
            numbers[k] = float(v)
        elif v is not None:
            notes[k] = str(v)[:2000]
    return numbers, notes


class Tracking:
    """The run's trackers, fanned out; a failing one is dropped and noted, never raised."""

    def __init__(self, backends: list[Backend], warnings: list[str] | None = None) -> None:
        self.backends = list(backends)
        self.warnings = list(warnings or [])
        self.refs: dict[str, str] = {}
        self.last_step = 0

    def _each(self, what: str, call: Callable[[Backend], Any]) -> None:
        for backend in list(self.backends):
            try:
                result = call(backend)
            except Exception as e:  # any failure of a tracker: noted, the run goes on
                self._drop(backend, what, e)
                continue
            if what == "start" and isinstance(result, str):
                self.refs[backend.name] = result

    def _drop(self, backend: Backend, what: str, e: BaseException) -> None:
        self.backends.remove(backend)
        note = f"{backend.name}: {what} failed, not tracked from here on: {type(e).__name__}: {e}"
        self.warnings.append(note[:1000])
        log.warning("run tracking: %s", note)
        with contextlib.suppress(Exception):
            backend.finish(Outcome(status="tracking-failed"))  # close what it had opened

    def start(self, info: RunInfo) -> None:
        self._each("start", lambda b: b.start(info))

    def step(self, step: dict[str, Any]) -> None:
        """trainer/train.py's ``on_step``: one step's metrics dict."""
        self.last_step = int(step.get("step") or self.last_step + 1)
        values = step_metrics(step)
        self._each("logging a step", lambda b: b.log_step(self.last_step, values))

    def finish(self, outcome: Outcome) -> None:
        self._each("finishing", lambda b: b.finish(outcome))

    def summary(self) -> dict[str, Any]:
        """What the run keeps as ``config["tracking"]``."""
        return {"trackers": self.refs, "warnings": self.warnings}
