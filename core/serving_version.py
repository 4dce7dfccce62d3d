"""Which policy version serves a project: the one place that asks the database.

A project's serving version is its ``policy_versions`` row with status ``serving`` (the
highest version number, should a switch ever have left two). The gateway (its cached
pointer, the adapter sync, the dashboard and actions) and the trainer (publish, guards,
sample selection, rollback) read it through these functions; only the switch itself
(trainer/publish.py ``switch_serving``) writes it, with :func:`serving_in`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.live_adapters import live_path
from schemas.atdp import PolicyStatus
from schemas.tables import AuditEventRow, PolicyVersionRow

# The base model as a version: the target of a rollback or promote that serves no adapter
# (``rlgate adapters rollback base``, the admin API's ``"target": "base"``, the dashboard's
# button). While it serves a project, that project has no ``serving`` row and requests go
# to the engine without an adapter. An audit event of a switch to it has this target type
# and id; its ``previous`` names the version it replaced, and a switch away from it says
# ``previous: "base"``.
BASE = "base"
BASE_TARGET_TYPE = "base_model"


def is_base(target: object) -> bool:
    """Whether a rollback/promote ``target`` names the base model (``base``, any case)."""
    return isinstance(target, str) and target.strip().lower() == BASE


# versions no engine should hold: replaced (retired) or refused by the eval gate (rejected)
OUT_OF_SERVICE = (PolicyStatus.retired, PolicyStatus.rejected)


def serving_in(project_id: str) -> tuple[Any, ...]:
    """SQL: the row serves ``project_id`` (for a select, or the switch's update)."""
    return (
        PolicyVersionRow.project_id == project_id,
        PolicyVersionRow.status == PolicyStatus.serving,
    )


def serving_version(db: Session, project_id: str) -> PolicyVersionRow | None:
    """The project's serving version, or None while the base model serves it."""
    return db.scalars(
        select(PolicyVersionRow)
        .where(*serving_in(project_id))
        .order_by(PolicyVersionRow.version.desc())
        .limit(1)
    ).first()


def serving_versions(db: Session) -> dict[str, PolicyVersionRow]:
    """Every project that serves a version: project id -> its serving version."""
    out: dict[str, PolicyVersionRow] = {}
    rows = db.scalars(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.status == PolicyStatus.serving)
        .order_by(PolicyVersionRow.version)
    )
    for row in rows:  # ascending: the highest version of a project is kept
        out[row.project_id] = row
    return out


def adapters_in_service(db: Session) -> tuple[dict[str, str], set[str]]:
    """Across projects: (serving adapter name -> its stored path, the names of versions
    out of service), what every engine should and should not hold.

    A retired version whose live directory exists (core/live_adapters.py) is not counted
    out of service: a rollback or promote to it made that directory and loads it into the
    engines before it switches, so an adapter sync round that read the old status must not
    unload it in between. Every retirement removes the live directory first."""
    serving: dict[str, str] = {}
    out: set[str] = set()
    rows = db.execute(select(PolicyVersionRow.name, PolicyVersionRow.path, PolicyVersionRow.status))
    for name, path, status in rows:
        if status == PolicyStatus.serving:
            serving[name] = path
        elif status in OUT_OF_SERVICE and not (path and live_path(path).is_dir()):
            out.add(name)
    return serving, out


def previous_version(db: Session, project_id: str) -> str | None:
    """The name of what served before the current version: the ``previous`` of the last
    promote/rollback audit event (``base``: the base model), else the newest retired
    version below the serving one, else the base model. None while the base model
    serves (nothing to roll back from)."""
    serving = serving_version(db, project_id)
    if serving is None:
        return None
    events = db.scalars(
        select(AuditEventRow)
        .where(
            AuditEventRow.project_id == project_id,
            AuditEventRow.target_id == serving.id,
            AuditEventRow.action.in_(("adapter.promote", "adapter.rollback")),
        )
        .order_by(AuditEventRow.created_at.desc())
        .limit(1)
    ).first()
    prev_name = (events.details or {}).get("previous") if events else None
    if is_base(prev_name):
        return BASE
    if prev_name:
        pv = db.scalars(
            select(PolicyVersionRow).where(
                PolicyVersionRow.project_id == project_id, PolicyVersionRow.name == prev_name
            )
        ).first()
        if pv is not None and pv.status != PolicyStatus.rejected:
            return pv.name
    pv = db.scalars(
        select(PolicyVersionRow)
        .where(
            PolicyVersionRow.project_id == project_id,
            PolicyVersionRow.status == PolicyStatus.retired,
            PolicyVersionRow.version < serving.version,
        )
        .order_by(PolicyVersionRow.version.desc())
        .limit(1)
    ).first()
    return pv.name if pv is not None else BASE
