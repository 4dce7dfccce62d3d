"""Switching the version a project serves: publish a trained candidate (gated), retry,
re-serve (rollback/promote), list. ``publish_version`` rejects a candidate whose parent
was rolled back meanwhile (it was trained from a version a guard or an operator took out
of service)."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine, session_factory, transaction
from core.keys import audit
from core.live_adapters import drop_live
from core.serving_version import BASE, is_base, serving_version, serving_versions
from core.settings import Settings, get_settings
from schemas.atdp import PolicyStatus, RunStatus
from schemas.tables import PolicyVersionRow, ProjectRow, TrainingRunRow
from trainer import publish, runs
from trainer.config import TrainConfig

log = logging.getLogger("rlgate.trainer")


@lru_cache(maxsize=8)
def _factory_for(url: str) -> sessionmaker[Session]:
    return session_factory(make_engine(url))


def db_factory(settings: Settings | None = None) -> sessionmaker[Session]:
    return _factory_for((settings or get_settings()).effective_database_url)


def project_config(db: Session, project_id: str) -> tuple[ProjectRow, TrainConfig]:
    project = db.get(ProjectRow, project_id)
    if project is None:
        raise LookupError(f"no project {project_id!r}")
    return project, TrainConfig.from_project_settings(project.settings)


def publish_version(
    factory: sessionmaker[Session], settings: Settings, version_id: str, actor: str = "system"
) -> bool:
    """Load a candidate everywhere, gate it, make it serving, unload the old one."""
    with factory() as db:
        pv = db.get(PolicyVersionRow, version_id)
        if pv is None or pv.status != PolicyStatus.candidate:
            return False
        # the gate's settings only, validated by the gate itself: settings broken since the
        # run trained make it fail closed (rejected with the reason) instead of raising here
        project = db.get(ProjectRow, pv.project_id)
        project_settings = dict(project.settings or {}) if project is not None else {}
        training = project_settings.get("training")
        gate = training.get("eval_gate") if isinstance(training, dict) else None
        serving = serving_version(db, pv.project_id)
        serving_name = serving.name if serving else None
        project_id, name, path, run_id = pv.project_id, pv.name, pv.path, pv.created_by_run_id
        parent = db.scalars(
            select(PolicyVersionRow).where(
                PolicyVersionRow.project_id == project_id,
                PolicyVersionRow.name == pv.parent_name,
            )
        ).first()
        rolled_back = parent is not None and parent.version > (serving.version if serving else 0)
    if rolled_back:  # trained from a version that was rolled back meanwhile (a guard)
        why = {"reason": "parent_rolled_back"}
        _reject(factory, version_id, project_id, name, run_id, actor, why)
        return False
    urls: list[str] = []
    try:
        urls = publish.engines(settings)
        publish.load_everywhere(urls, name, publish.serve_from(path), settings.engine_headers)
        publish.warm(urls, name, settings.engine_headers)
        ok, metrics = publish.eval_gate(
            urls[0],
            name,
            serving_name,
            gate or {},
            settings.engine_headers,
            project_settings=project_settings,
            project_id=project_id,
            budget_s=settings.eval_gate_budget,
        )
        if metrics:
            with transaction(factory) as db:
                db.get(PolicyVersionRow, version_id).eval_metrics = metrics  # type: ignore[union-attr]
        if not ok:
            _reject(factory, version_id, project_id, name, run_id, actor, metrics)
            publish.retire(urls, name, path, settings.engine_headers)
            return False
        previous = publish.switch_serving(
            factory,
            project_id,
            version_id,
            actor=actor,
            action="adapter.promote",
            run_id=run_id,
            require_newer=True,
        )
    except Exception as e:  # engine down or refusing: retried by the next tick
        log.warning("publishing %s failed: %s", name, e)
        if run_id:
            runs.finish(factory, run_id, RunStatus.trained_not_published, f"publish failed: {e}")
        return False
    log.info("project %s: %s is serving (was %s)", project_id, name, previous)
    if previous and previous != name:
        _retire(factory, settings, urls, project_id, previous)
    return True


def _path_of(factory: sessionmaker[Session], project_id: str, name: str) -> str | None:
    with factory() as db:
        return db.scalars(
            select(PolicyVersionRow.path).where(
                PolicyVersionRow.project_id == project_id, PolicyVersionRow.name == name
            )
        ).first()


def _retire(
    factory: sessionmaker[Session],
    settings: Settings,
    urls: list[str],
    project_id: str,
    name: str,
) -> None:
    """The version ``name`` was replaced: out of every engine for good (publish.retire)."""
    path = _path_of(factory, project_id, name)
    if path is not None:
        publish.retire(urls, name, path, settings.engine_headers)
    else:
        publish.unload_everywhere(urls, name, settings.engine_headers)


def _reject(
    factory: sessionmaker[Session],
    version_id: str,
    project_id: str,
    name: str,
    run_id: str | None,
    actor: str,
    metrics: dict[str, Any],
) -> None:
    with transaction(factory) as db:
        db.get(PolicyVersionRow, version_id).status = PolicyStatus.rejected  # type: ignore[union-attr]
        audit(
            db,
            actor,
            "adapter.reject",
            project_id,
            "policy_version",
            version_id,
            {"name": name, **metrics},
        )
    if run_id:
        why = (
            "its parent version was rolled back"
            if metrics.get("reason") == "parent_rolled_back"
            else f"eval gate: {metrics}"
        )
        runs.finish(factory, run_id, RunStatus.trained_not_published, f"{name} rejected: {why}")


def retry_publish(
    settings: Settings | None = None, factory: sessionmaker[Session] | None = None
) -> list[str]:
    """Publish candidates whose run trained but could not publish (newest per project)."""
    settings = settings or get_settings()
    factory = factory or db_factory(settings)
    with factory() as db:
        rows = db.execute(
            select(PolicyVersionRow.id, PolicyVersionRow.project_id, PolicyVersionRow.version)
            .join(TrainingRunRow, TrainingRunRow.id == PolicyVersionRow.created_by_run_id)
            .where(
                PolicyVersionRow.status == PolicyStatus.candidate,
                TrainingRunRow.status == RunStatus.trained_not_published,
            )
            .order_by(PolicyVersionRow.version.desc())
        ).all()
        serving = {pid: row.version for pid, row in serving_versions(db).items()}
    done, seen = [], set()
    for vid, pid, version in rows:
        if pid in seen or version <= serving.get(pid, 0):
            continue
        seen.add(pid)
        if publish_version(factory, settings, vid):
            done.append(vid)
    return done


def serve_version(
    project_id: str,
    target: str | int,
    *,
    actor: str = "cli",
    action: str = "adapter.rollback",
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    details: dict[str, Any] | None = None,
    unload: bool = True,
) -> dict[str, Any]:
    """Re-serve an earlier (or any) version: load it if needed, switch the pointer,
    retire the one it replaces. ``target`` is a name, a version number or ``base`` (the
    base model: core/serving_version.py ``BASE``; nothing to load, requests then go to
    the engine without an adapter); ``details`` go into the audit event (a guard's reason
    and figures). A rejected version is refused (LookupError is an unknown one).

    ``unload``: unload the replaced version from every engine before returning (each
    engine waits for the requests still using it). False: return once new requests go to
    the new version; the replaced one's live directory is removed (no engine can re-load
    it on demand) and ``"unloading"`` names it: a gateway's background unload
    (gateway/engines/unloads.py) or adapter sync round unloads it when its requests are done."""
    settings = settings or get_settings()
    factory = factory or db_factory(settings)
    if is_base(target):
        return _serve_base(project_id, actor, action, settings, factory, details, unload)
    with factory() as db:
        q = select(PolicyVersionRow).where(PolicyVersionRow.project_id == project_id)
        if isinstance(target, int) or str(target).isdigit():
            q = q.where(PolicyVersionRow.version == int(target))
        else:
            q = q.where(PolicyVersionRow.name == str(target))
        pv = db.scalars(q).first()
        if pv is None:
            raise LookupError(
                f"no version {target!r} in project {project_id!r} (a name, a version "
                f"number, or {BASE!r} for the base model)"
            )
        vid, name, path, status = pv.id, pv.name, pv.path, pv.status
    if status == PolicyStatus.serving:
        return {"name": name, "previous": None, "changed": False}
    if status == PolicyStatus.rejected:
        raise publish.RefusedVersion(f"{name} was rejected by the eval gate; it cannot be served")
    urls = publish.engines(settings)
    publish.load_everywhere(urls, name, publish.serve_from(path), settings.engine_headers)
    previous = publish.switch_serving(
        factory, project_id, vid, actor=actor, action=action, details=details
    )
    return _after_switch(factory, settings, urls, project_id, name, previous, unload)


def _serve_base(
    project_id: str,
    actor: str,
    action: str,
    settings: Settings,
    factory: sessionmaker[Session],
    details: dict[str, Any] | None,
    unload: bool,
) -> dict[str, Any]:
    """Serve the base model: no version serves the project from now on (audited)."""
    with factory() as db:
        serving = serving_version(db, project_id)
        known = serving is not None or db.get(ProjectRow, project_id) is not None
    if not known:
        raise LookupError(f"no project {project_id!r}")
    if serving is None:
        return {"name": BASE, "previous": None, "changed": False}
    urls = publish.engines(settings) if unload else []
    previous = publish.switch_serving(
        factory, project_id, None, actor=actor, action=action, details=details
    )
    return _after_switch(factory, settings, urls, project_id, BASE, previous, unload)


def _after_switch(
    factory: sessionmaker[Session],
    settings: Settings,
    urls: list[str],
    project_id: str,
    name: str,
    previous: str | None,
    unload: bool,
) -> dict[str, Any]:
    """Retire the replaced version: unloaded now (``unload``), or only its live directory
    removed and its name returned as ``unloading`` (the caller's background unload, or a
    gateway's adapter sync, unloads it once its requests are done)."""
    out: dict[str, Any] = {"name": name, "previous": previous, "changed": True}
    if not previous or previous == name:
        return out
    if unload:
        _retire(factory, settings, urls, project_id, previous)
        return out
    path = _path_of(factory, project_id, previous)
    if path is not None:
        drop_live(path)
    out["unloading"] = previous
    return out


def list_versions(
    project_id: str | None = None, factory: sessionmaker[Session] | None = None
) -> list[dict[str, Any]]:
    factory = factory or db_factory()
    with factory() as db:
        q = select(PolicyVersionRow).order_by(PolicyVersionRow.project_id, PolicyVersionRow.version)
        if project_id:
            q = q.where(PolicyVersionRow.project_id == project_id)
        return [
            {
                "project": r.project_id,
                "name": r.name,
                "version": r.version,
                "status": r.status,
                "parent": r.parent_name,
                "run": r.created_by_run_id,
                "created_at": r.created_at.isoformat() if r.created_at else None,
                "promoted_at": r.promoted_at.isoformat() if r.promoted_at else None,
                "path": r.path,
                "eval_metrics": r.eval_metrics,
            }
            for r in db.scalars(q)
        ]
