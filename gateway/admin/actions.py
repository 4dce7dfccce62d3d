"""Dashboard actions: train now, promote, roll back, retire, pause / resume, training
settings, keys.

Train now and promote / roll back go through the trainer's functions
(``trainer.api.train_now``, ``trainer.api.serve_version``: the same code the CLI
uses); retire, pause and keys are database changes here. Every action writes an
AuditEvent (the trainer functions write their own).

All functions are blocking (database, engine HTTP): call them in a worker thread.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from core.feedback_rules import AGENT_KEYS_RATE, agent_keys_rate
from core.keys import audit, create_key, revoke_key
from core.serving_version import BASE, is_base, previous_version
from core.settings import Settings
from schemas.atdp import KeyKind, PolicyStatus, RunStatus
from schemas.tables import ApiKeyRow, PolicyVersionRow, ProjectRow

log = logging.getLogger("rlgate.admin")


class ActionError(Exception):
    """An action that cannot be done as asked; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _project(db: Session, project_id: str) -> ProjectRow:
    project = db.get(ProjectRow, project_id)
    if project is None:
        raise ActionError(404, f"no project {project_id!r}")
    return project


# ---- training -----------------------------------------------------------------------


def train_now(factory: sessionmaker[Session], project_id: str, actor: str) -> dict[str, Any]:
    """Queue a manual run; returns ``{"run_id", "status"}``."""
    with factory() as db:
        _project(db, project_id)
    from trainer import api

    try:
        run_id = api.train_now(project_id, actor, factory=factory)
    except LookupError as e:
        raise ActionError(404, str(e)) from None
    except Exception as e:  # broker down: the run row exists, the message did not go
        log.exception("train-now could not enqueue")
        raise ActionError(503, f"the run was created but not queued: {e}") from None
    return {"run_id": run_id, "status": RunStatus.queued, "via": "trainer"}


def set_paused(
    factory: sessionmaker[Session], project_id: str, paused: bool, actor: str
) -> dict[str, Any]:
    with transaction(factory) as db:
        project = _project(db, project_id)
        changed = bool(project.training_paused) != paused
        project.training_paused = paused
        if changed:
            action = "training.pause" if paused else "training.resume"
            audit(db, actor, action, project_id, "project", project_id, {})
    return {"project_id": project_id, "training_paused": paused, "changed": changed}


def training_settings(factory: sessionmaker[Session], project_id: str) -> dict[str, Any]:
    from trainer import api

    with factory() as db:
        project = _project(db, project_id)
        overrides = dict((project.settings or {}).get("training") or {})
    effective = api.effective_training(overrides)  # {"error": ...} when stored broken
    return {"project_id": project_id, "overrides": overrides, "effective": effective}


def update_training_settings(
    factory: sessionmaker[Session], project_id: str, changes: dict[str, Any], actor: str
) -> dict[str, Any]:
    """Merge ``changes`` into the project's training overrides (a null value removes an
    override); the result must be a valid TrainConfig (types, the bounds table, the
    eval gate's schema, a registered gate verifier), else nothing changes (400)."""
    from trainer import api

    with transaction(factory) as db:
        project = _project(db, project_id)
        settings = dict(project.settings or {})
        overrides = dict(settings.get("training") or {})
        for key, value in changes.items():
            if value is None:
                overrides.pop(key, None)
            else:
                overrides[key] = value
        try:
            api.check_training(overrides)
        except (TypeError, ValueError) as e:  # TrainConfigError, GateConfigError: ValueErrors
            raise ActionError(400, f"training settings not changed: {e}") from None
        settings["training"] = overrides
        project.settings = settings
        audit(db, actor, "training.settings", project_id, "project", project_id, changes)
    return training_settings(factory, project_id)


# ---- who may rate (core/feedback_rules.py) ----------------------------------------------


def feedback_settings(factory: sessionmaker[Session], project_id: str) -> dict[str, Any]:
    with factory() as db:
        settings = dict(_project(db, project_id).settings or {})
    return {"project_id": project_id, AGENT_KEYS_RATE: agent_keys_rate(settings)}


def update_feedback_settings(
    factory: sessionmaker[Session], project_id: str, changes: dict[str, Any], actor: str
) -> dict[str, Any]:
    """Body ``{"agent_keys_rate": bool}``: whether the project's agent keys may rate
    (false: only its feedback and admin keys). Audited."""
    value = changes.get(AGENT_KEYS_RATE)
    if set(changes) != {AGENT_KEYS_RATE} or not isinstance(value, bool):
        raise ActionError(400, f'the body must be {{"{AGENT_KEYS_RATE}": true or false}}')
    with transaction(factory) as db:
        project = _project(db, project_id)
        settings = dict(project.settings or {})
        settings[AGENT_KEYS_RATE] = value
        project.settings = settings
        audit(db, actor, "feedback.settings", project_id, "project", project_id, changes)
    return feedback_settings(factory, project_id)


# ---- adapters -----------------------------------------------------------------------


def _version(db: Session, project_id: str, target: str) -> PolicyVersionRow:
    q = select(PolicyVersionRow).where(PolicyVersionRow.project_id == project_id)
    if str(target).isdigit():
        q = q.where(PolicyVersionRow.version == int(target))
    else:
        q = q.where((PolicyVersionRow.name == target) | (PolicyVersionRow.id == target))
    pv = db.scalars(q).first()
    if pv is None:
        raise ActionError(
            404,
            f"no policy version {target!r} in project {project_id!r} (a name, id, version "
            f"number, or {BASE!r} for the base model)",
        )
    return pv


def _serve(
    factory: sessionmaker[Session],
    settings: Settings,
    project_id: str,
    target: str,
    actor: str,
    action: str,
) -> dict[str, Any]:
    """Switch the project to ``target`` (a version's name, or ``base``) and answer once
    new requests go to it: ``"unloading"`` names the replaced version, which the caller
    unloads in the background (gateway/engines/unloads.py). A rejected version is a 409."""
    from trainer import api

    try:
        return api.serve_version(
            project_id,
            target,
            actor=actor,
            action=action,
            settings=settings,
            factory=factory,
            unload=False,
        )
    except api.RefusedVersion as e:
        raise ActionError(409, str(e)) from None
    except api.PublishError as e:
        raise ActionError(502, str(e)) from None
    except LookupError as e:
        raise ActionError(404, str(e)) from None


def promote(
    factory: sessionmaker[Session], settings: Settings, project_id: str, target: str, actor: str
) -> dict[str, Any]:
    """Serve ``target`` (a name, id, version number, or ``base``); the serving one is
    retired."""
    with factory() as db:
        _project(db, project_id)
        name = BASE if is_base(target) else _version(db, project_id, target).name
    return _serve(factory, settings, project_id, name, actor, "adapter.promote")


def rollback(
    factory: sessionmaker[Session],
    settings: Settings,
    project_id: str,
    actor: str,
    target: str | None = None,
) -> dict[str, Any]:
    """Re-serve ``target`` (as :func:`promote`), or (None) what served before the current
    version: an earlier version, or the base model after the first one."""
    with factory() as db:
        _project(db, project_id)
        if target:
            name = BASE if is_base(target) else _version(db, project_id, target).name
        else:
            name = previous_version(db, project_id)
            if name is None:
                raise ActionError(
                    409,
                    f"project {project_id!r} already serves the base model; nothing to roll back",
                )
    return _serve(factory, settings, project_id, name, actor, "adapter.rollback")


def retire(
    factory: sessionmaker[Session], project_id: str, target: str, actor: str
) -> dict[str, Any]:
    """Mark a candidate (or an already retired) version retired; never the serving one,
    nor the base model."""
    if is_base(target):
        raise ActionError(
            409, "the base model cannot be retired; it is what serves without a version"
        )
    with transaction(factory) as db:
        pv = _version(db, project_id, target)
        if pv.status == PolicyStatus.serving:
            raise ActionError(
                409, f"{pv.name} is serving; promote or roll back to another version first"
            )
        changed = pv.status != PolicyStatus.retired
        before = pv.status
        pv.status = PolicyStatus.retired
        if changed:
            audit(
                db,
                actor,
                "adapter.retire",
                project_id,
                "policy_version",
                pv.id,
                {"name": pv.name, "version": pv.version, "before": before},
            )
        return {"name": pv.name, "status": PolicyStatus.retired, "changed": changed}


# ---- keys ---------------------------------------------------------------------------


def new_key(
    factory: sessionmaker[Session], project_id: str, kind: str, name: str | None, actor: str
) -> dict[str, Any]:
    try:
        KeyKind(kind)
    except ValueError:
        kinds = ", ".join(k.value for k in KeyKind)
        raise ActionError(400, f"kind must be one of {kinds}, not {kind!r}") from None
    with transaction(factory) as db:
        _project(db, project_id)
        row, secret = create_key(db, project_id, kind, name=name or None, actor=actor)
        return {
            "id": row.id,
            "project_id": project_id,
            "kind": row.kind,
            "name": row.name,
            "prefix": row.prefix,
            "secret": secret,
        }


def drop_key(
    factory: sessionmaker[Session], key_id: str, actor: str, projects: list[str] | None
) -> dict[str, Any]:
    with transaction(factory) as db:
        row = db.get(ApiKeyRow, key_id)
        if row is None or (projects is not None and row.project_id not in projects):
            raise ActionError(404, f"no key {key_id!r}")
        revoke_key(db, key_id, actor=actor)
        return {"id": key_id, "revoked_at": row.revoked_at.isoformat()}
