"""Functions for the admin API (and anything else that triggers or steers training)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from core.keys import audit
from trainer import runner, runs


def train_now(
    project_id: str,
    actor: str,
    *,
    factory: sessionmaker[Session] | None = None,
    queue: str | None = None,
) -> str:
    """Queue a manual run (ignores the threshold); returns its run id at once.

    The run row exists immediately with status ``queued``; a worker picks it up.
    """
    from trainer.tasks import train_project

    factory = factory or runner.db_factory()
    run_id = runs.create_queued(factory, project_id, "manual")
    with transaction(factory) as db:
        audit(db, actor, "training.trigger", project_id, "training_run", run_id, {})
    options = {"queue": queue} if queue else {}
    train_project.apply_async(args=(project_id, "manual", run_id), **options)
    return run_id


def rollback(project_id: str, target: str | int, actor: str) -> dict[str, Any]:
    """Re-serve an earlier version (name or number); an AuditEvent adapter.rollback."""
    return runner.serve_version(project_id, target, actor=actor, action="adapter.rollback")


def promote(project_id: str, target: str | int, actor: str) -> dict[str, Any]:
    """Serve a given version (e.g. a candidate); an AuditEvent adapter.promote."""
    return runner.serve_version(project_id, target, actor=actor, action="adapter.promote")


def list_adapters(project_id: str | None = None) -> list[dict[str, Any]]:
    return runner.list_versions(project_id)
