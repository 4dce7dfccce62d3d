"""Training-run rows as a per-project lock: claim, heartbeat, takeover, finish.

One active run per project: a run is active while its status is ``running``. Claiming
happens in one transaction that first updates the project row (a row lock on PostgreSQL,
the write lock on SQLite), so two claimers are serialized and the second one sees the
first one's run. A ``running`` run whose worker is gone is taken over: its heartbeat
(``config["heartbeat_at"]``, refreshed every few seconds) is older than ``stale_after_s``,
or its worker process (``config["worker"]`` = host:pid) is on this host and not alive.
The taken-over run is marked failed; it had consumed and published nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from core.keys import new_id
from schemas.atdp import RunStatus
from schemas.coltypes import utcnow
from schemas.tables import ProjectRow, TrainingRunRow

ACTIVE = RunStatus.running
TERMINAL = (
    RunStatus.published,
    RunStatus.trained_not_published,
    RunStatus.failed,
    RunStatus.cancelled,
)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has ``pid`` (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(run: TrainingRunRow, stale_after_s: float, now: datetime | None = None) -> bool:
    now = now or utcnow()
    cfg = run.config or {}
    worker = str(cfg.get("worker") or "")
    host, _, pid = worker.rpartition(":")
    same_host = host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid()
    if same_host and not pid_alive(int(pid)):
        return True
    beat = cfg.get("heartbeat_at")
    last = datetime.fromisoformat(beat) if beat else (run.started_at or run.created_at)
    if last.tzinfo is None:
        last = last.replace(tzinfo=now.tzinfo)
    return now - last > timedelta(seconds=stale_after_s)


def lock_project(db: Session, project_id: str) -> ProjectRow | None:
    """Serialize training decisions of one project until the transaction ends."""
    db.execute(
        update(ProjectRow)
        .where(ProjectRow.id == project_id)
        .values(training_paused=ProjectRow.training_paused)
    )
    return db.get(ProjectRow, project_id)


def recover_stale(db: Session, project_id: str, stale_after_s: float) -> list[str]:
    """Mark dead 'running' runs failed (call with the project locked)."""
    failed = []
    runs = db.scalars(
        select(TrainingRunRow).where(
            TrainingRunRow.project_id == project_id, TrainingRunRow.status == ACTIVE
        )
    ).all()
    for run in runs:
        if is_stale(run, stale_after_s):
            run.status = RunStatus.failed
            run.error = (
                f"worker lost: {run.config.get('worker')} stopped heartbeating "
                f"(last {run.config.get('heartbeat_at')}); taken over, nothing published"
            )
            run.finished_at = utcnow()
            failed.append(run.id)
    return failed


def create_queued(factory: sessionmaker[Session], project_id: str, trigger: str) -> str:
    run_id = new_id("run")
    with transaction(factory) as db:
        if db.get(ProjectRow, project_id) is None:
            raise LookupError(f"no project {project_id!r}")
        db.add(
            TrainingRunRow(
                id=run_id,
                project_id=project_id,
                trigger=trigger,
                status=RunStatus.queued,
                created_at=utcnow(),
            )
        )
    return run_id


def claim(
    factory: sessionmaker[Session],
    project_id: str,
    trigger: str,
    config: dict[str, Any],
    stale_after_s: float,
    run_id: str | None = None,
) -> tuple[str | None, str]:
    """Start a run (the given queued one, or a new one). Returns (run id, reason);
    run id is None when another live run holds the project or the run is finished."""
    now = utcnow()
    with transaction(factory) as db:
        project = lock_project(db, project_id)
        if project is None:
            raise LookupError(f"no project {project_id!r}")
        recover_stale(db, project_id, stale_after_s)
        run = db.get(TrainingRunRow, run_id) if run_id else None
        if run is not None and run.status in TERMINAL:
            return None, f"run {run_id} is already {run.status}"
        if run is not None and run.status == ACTIVE:
            return None, f"run {run_id} is already running"
        busy = db.scalars(
            select(TrainingRunRow.id).where(
                TrainingRunRow.project_id == project_id, TrainingRunRow.status == ACTIVE
            )
        ).first()
        if busy:
            return None, f"run {busy} is active for project {project_id}"
        if run is None:
            run = TrainingRunRow(
                id=run_id or new_id("run"),
                project_id=project_id,
                trigger=trigger,
                created_at=now,
            )
            db.add(run)
        run.status = ACTIVE
        run.started_at = now
        run.error = None
        run.config = {**config, "worker": worker_id(), "heartbeat_at": now.isoformat()}
        return run.id, "claimed"


def heartbeat(factory: sessionmaker[Session], run_id: str, extra: dict[str, Any] | None = None):
    """Refresh the heartbeat (and append step metrics) if the run is still ours."""
    with transaction(factory) as db:
        run = db.get(TrainingRunRow, run_id)
        if run is None or run.status != ACTIVE or run.config.get("worker") != worker_id():
            return False
        run.config = {**run.config, "heartbeat_at": utcnow().isoformat()}
        if extra and "step" in extra:
            run.step_metrics = [*(run.step_metrics or []), extra["step"]]
        return True


class Heartbeat:
    """A thread that refreshes the run's heartbeat while the run trains."""

    def __init__(self, factory: sessionmaker[Session], run_id: str, every_s: float) -> None:
        self.factory, self.run_id, self.every_s = factory, run_id, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlgate-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):  # a missed beat is retried next time
                heartbeat(self.factory, self.run_id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def finish(
    factory: sessionmaker[Session],
    run_id: str,
    status: str,
    error: str | None = None,
    **fields: Any,
) -> None:
    with transaction(factory) as db:
        run = db.get(TrainingRunRow, run_id)
        if run is None:
            return
        run.status = status
        run.error = error
        run.finished_at = utcnow()
        if "data_stats" in fields:  # kept with the run's config, as a committed run's
            run.config = {**(run.config or {}), "data_stats": fields.pop("data_stats")}
        for k, v in fields.items():
            setattr(run, k, v)


def annotate(factory: sessionmaker[Session], run_id: str, key: str, value: Any) -> None:
    """Keep ``value`` under the run's ``config[key]``, whatever its status (the dashboard's
    run page shows the config)."""
    with transaction(factory) as db:
        run = db.get(TrainingRunRow, run_id)
        if run is not None:
            run.config = {**(run.config or {}), key: value}
