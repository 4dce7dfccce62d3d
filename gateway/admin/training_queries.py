"""Read-side queries of the dashboard about training: runs, their steps and samples,
adapters (policy versions), guard rollbacks, and API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.admin.paging import (
    PAGE_SIZE,
    Filters,
    Page,
    Scope,
    Values,
    duration,
    in_scope,
    page_of,
)
from schemas.tables import (
    ApiKeyRow,
    AuditEventRow,
    InteractionRow,
    PolicyVersionRow,
    TrainingRunRow,
)
from trainer.api import CHARTS

STEP_METRICS = CHARTS  # (name, label) of each charted metric: trainer/metrics.py


# ---- runs ---------------------------------------------------------------------------


def last_guard_rollback(db: Session, project_id: str, since: datetime) -> dict[str, Any] | None:
    """The newest rollback a guard (trainer/guards.py) made since ``since``, or None."""
    e = db.scalars(
        select(AuditEventRow)
        .where(
            AuditEventRow.project_id == project_id,
            AuditEventRow.action == "adapter.rollback",
            AuditEventRow.actor == "guard",
            AuditEventRow.created_at >= since,
        )
        .order_by(AuditEventRow.created_at.desc())
        .limit(1)
    ).first()
    if e is None:
        return None
    d = e.details or {}
    serving, best = d.get("serving_stats") or {}, d.get("best_stats") or {}
    return {
        "at": e.created_at,
        "reason": d.get("reason"),
        "rolled_back": d.get("rolled_back") or d.get("previous"),
        "to": d.get("name"),
        "serving_reward": serving.get("mean_reward"),
        "best_reward": best.get("mean_reward"),
        "p_value": d.get("p_value"),
    }


def run_summary(db: Session, r: TrainingRunRow, pv: PolicyVersionRow | None = None) -> dict:
    if pv is None and r.policy_version_id:
        pv = db.get(PolicyVersionRow, r.policy_version_id)
    return {
        "id": r.id,
        "project_id": r.project_id,
        "trigger": r.trigger,
        "status": r.status,
        "num_samples": r.num_samples,
        "steps": len(r.step_metrics or []),
        "created_at": r.created_at,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "duration_s": duration(r.started_at, r.finished_at),
        "policy_version": (
            {"id": pv.id, "name": pv.name, "version": pv.version, "status": pv.status}
            if pv
            else None
        ),
        "error": r.error,
        "guard": ((r.config or {}).get("data_stats") or {}).get("guard"),
        "stopped_early": bool(
            (((r.config or {}).get("data_stats") or {}).get("run_metrics") or {}).get(
                "stopped_early"
            )
        ),
    }


RUN_FILTERS = Filters(
    equal={
        "project": TrainingRunRow.project_id,
        "status": TrainingRunRow.status,
        "trigger": TrainingRunRow.trigger,
    }
)


def runs(db: Session, scope: Scope, f: Values, *, page: int = 1, size: int = PAGE_SIZE) -> Page:
    q = RUN_FILTERS.narrow(select(TrainingRunRow), scope, f)
    rows, total = page_of(
        db, q, page, size, [TrainingRunRow.created_at.desc(), TrainingRunRow.id.desc()]
    )
    pv_ids = [r.policy_version_id for (r,) in rows if r.policy_version_id]
    pvs = {
        pv.id: pv
        for pv in (
            db.scalars(select(PolicyVersionRow).where(PolicyVersionRow.id.in_(pv_ids)))
            if pv_ids
            else []
        )
    }
    items = [run_summary(db, r, pvs.get(r.policy_version_id or "")) for (r,) in rows]
    return Page(items, total, page, size)


def run_detail(
    db: Session, scope: list[str] | None, run_id: str, *, page: int = 1, size: int = PAGE_SIZE
) -> dict[str, Any] | None:
    r = db.get(TrainingRunRow, run_id)
    if r is None or (scope is not None and r.project_id not in scope):
        return None
    pv = db.get(PolicyVersionRow, r.policy_version_id) if r.policy_version_id else None
    if pv is None:
        pv = db.scalars(
            select(PolicyVersionRow).where(PolicyVersionRow.created_by_run_id == r.id)
        ).first()
    steps = [s for s in (r.step_metrics or []) if isinstance(s, dict)]
    series = {
        key: [float(s[key]) if isinstance(s.get(key), int | float) else None for s in steps]
        for key, _ in STEP_METRICS
    }
    q = select(
        InteractionRow.id,
        InteractionRow.session_id,
        InteractionRow.reward,
        InteractionRow.policy_version,
        InteractionRow.created_at,
    ).where(InteractionRow.consumed_by_run_id == r.id)
    rows, total = page_of(db, q, page, size, [InteractionRow.created_at, InteractionRow.id])
    out = run_summary(db, r, pv)
    out.update(
        {
            "config": r.config,
            "step_metrics": steps,
            "series": series,
            "eval_metrics": pv.eval_metrics if pv else None,
            "samples": Page(
                [
                    {
                        "id": i,
                        "session_id": sid,
                        "reward": rw,
                        "policy_version": ver,
                        "created_at": at,
                    }
                    for i, sid, rw, ver, at in rows
                ],
                total,
                page,
                size,
            ),
        }
    )
    return out


# ---- adapters, keys -----------------------------------------------------------------


def adapters(
    db: Session, scope: list[str] | None, *, project: str | None = None
) -> list[dict[str, Any]]:
    q = in_scope(select(PolicyVersionRow), PolicyVersionRow.project_id, scope)
    if project:
        q = q.where(PolicyVersionRow.project_id == project)
    q = q.order_by(PolicyVersionRow.project_id, PolicyVersionRow.version.desc()).limit(1000)
    return [
        {
            "id": pv.id,
            "project_id": pv.project_id,
            "name": pv.name,
            "version": pv.version,
            "parent_name": pv.parent_name,
            "base_model": pv.base_model,
            "status": pv.status,
            "eval_metrics": pv.eval_metrics,
            "lora_config": pv.lora_config,
            "created_by_run_id": pv.created_by_run_id,
            "created_at": pv.created_at,
            "promoted_at": pv.promoted_at,
        }
        for pv in db.scalars(q)
    ]


KEY_FILTERS = Filters(
    equal={"project": ApiKeyRow.project_id, "kind": ApiKeyRow.kind},
    flags={"include_revoked": "revoked", "include_session_keys": "session_keys"},
)


def keys(db: Session, scope: Scope, f: Values, *, page: int = 1, size: int = PAGE_SIZE) -> Page:
    q = KEY_FILTERS.narrow(select(ApiKeyRow), scope, f)
    if not f.get("include_revoked"):
        q = q.where(ApiKeyRow.revoked_at.is_(None))
    if not f.get("include_session_keys"):
        q = q.where(ApiKeyRow.session_id.is_(None))
    rows, total = page_of(db, q, page, size, [ApiKeyRow.created_at.desc(), ApiKeyRow.id.desc()])
    items = [
        {
            "id": k.id,
            "project_id": k.project_id,
            "kind": k.kind,
            "name": k.name,
            "prefix": k.prefix,
            "session_id": k.session_id,
            "created_at": k.created_at,
            "last_used_at": k.last_used_at,
            "revoked_at": k.revoked_at,
        }
        for (k,) in rows
    ]
    return Page(items, total, page, size)
