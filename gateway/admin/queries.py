"""Read-side queries of the dashboard; every list is paged in SQL (LIMIT/OFFSET plus one
COUNT), so a project with millions of rows renders one page at a time.

``projects`` is the caller's scope: ``None`` for the bootstrap admin (every project), else
the list of project ids an admin key may see (its own project).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.orm import Session

from core.serving_version import serving_version
from gateway.admin.paging import (
    MAX_PAGE_SIZE,
    PAGE_SIZE,
    Filters,
    Page,
    Scope,
    Values,
    fields,
    in_scope,
    jsonable,
    page_of,
)
from gateway.admin.training_queries import (
    KEY_FILTERS,
    RUN_FILTERS,
    STEP_METRICS,
    adapters,
    keys,
    last_guard_rollback,
    run_detail,
    run_summary,
    runs,
)
from gateway.api.display import request_messages
from schemas.atdp import SessionStatus
from schemas.coltypes import utcnow
from schemas.tables import (
    FeedbackRow,
    InteractionRow,
    ProjectRow,
    SessionRow,
    TrainingRunRow,
)

MAX_TOKENS_SHOWN = 4000

__all__ = [
    "KEY_FILTERS",
    "MAX_PAGE_SIZE",
    "PAGE_SIZE",
    "RUN_FILTERS",
    "STEP_METRICS",
    "Page",
    "adapters",
    "jsonable",
    "keys",
    "last_guard_rollback",
    "run_detail",
    "runs",
]


# ---- overview -----------------------------------------------------------------------


def projects(db: Session, scope: list[str] | None) -> list[str]:
    q = in_scope(select(ProjectRow.id), ProjectRow.id, scope).order_by(ProjectRow.id)
    return list(db.scalars(q))


def overview(db: Session, scope: list[str] | None, hours: int = 24) -> dict[str, Any]:
    now = utcnow()
    out = []
    for p in db.scalars(in_scope(select(ProjectRow), ProjectRow.id, scope).order_by(ProjectRow.id)):
        serving = serving_version(db, p.id)
        last_run = db.scalars(
            select(TrainingRunRow)
            .where(TrainingRunRow.project_id == p.id)
            .order_by(TrainingRunRow.created_at.desc())
            .limit(1)
        ).first()
        n_sessions = db.scalar(
            select(func.count()).select_from(SessionRow).where(SessionRow.project_id == p.id)
        )
        open_sessions = db.scalar(
            select(func.count())
            .select_from(SessionRow)
            .where(SessionRow.project_id == p.id, SessionRow.status == SessionStatus.open)
        )
        recent = db.execute(
            select(
                func.count(), func.count(InteractionRow.reward), func.avg(InteractionRow.reward)
            ).where(
                InteractionRow.project_id == p.id,
                InteractionRow.created_at >= now - timedelta(hours=1),
            )
        ).one()
        last5 = db.scalar(
            select(func.count())
            .select_from(InteractionRow)
            .where(
                InteractionRow.project_id == p.id,
                InteractionRow.created_at >= now - timedelta(minutes=5),
            )
        )
        out.append(
            {
                "id": p.id,
                "name": p.name,
                "training_paused": bool(p.training_paused),
                "serving": (
                    {"name": serving.name, "version": serving.version, "id": serving.id}
                    if serving
                    else None
                ),
                "sessions": int(n_sessions or 0),
                "open_sessions": int(open_sessions or 0),
                "requests_per_min": round((last5 or 0) / 5.0, 2),
                "requests_last_hour": int(recent[0]),
                "feedback_rate_last_hour": (recent[1] / recent[0]) if recent[0] else None,
                "mean_reward_last_hour": float(recent[2]) if recent[2] is not None else None,
                "last_run": run_summary(db, last_run) if last_run else None,
                "guard": last_guard_rollback(db, p.id, now - timedelta(hours=24)),
            }
        )
    return {"projects": out, "series": timeseries(db, scope, hours, now), "now": now}


def timeseries(
    db: Session, scope: list[str] | None, hours: int, now: datetime | None = None
) -> dict[str, Any]:
    """Hourly buckets: requests, rated fraction, mean interaction reward, feedback count.
    One indexed aggregate per bucket (portable across SQLite and PostgreSQL)."""
    now = now or utcnow()
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    labels, requests, rate, reward, feedback = [], [], [], [], []
    for i in range(hours, 0, -1):
        a, b = end - timedelta(hours=i), end - timedelta(hours=i - 1)
        q = select(
            func.count(), func.count(InteractionRow.reward), func.avg(InteractionRow.reward)
        ).where(InteractionRow.created_at >= a, InteractionRow.created_at < b)
        n, rated, mean = db.execute(in_scope(q, InteractionRow.project_id, scope)).one()
        fq = (
            select(func.count())
            .select_from(FeedbackRow)
            .where(FeedbackRow.created_at >= a, FeedbackRow.created_at < b)
        )
        nf = db.scalar(in_scope(fq, FeedbackRow.project_id, scope))
        labels.append(a.strftime("%m-%d %H:00"))
        requests.append(int(n))
        rate.append(rated / n if n else None)
        reward.append(float(mean) if mean is not None else None)
        feedback.append(int(nf or 0))
    return {
        "bucket": "hour",
        "labels": labels,
        "requests": requests,
        "feedback": feedback,
        "feedback_rate": rate,
        "mean_reward": reward,
    }


# ---- sessions -----------------------------------------------------------------------


SESSION_FILTERS = Filters(
    equal={
        "project": SessionRow.project_id,
        "status": SessionRow.status,
        "agent": SessionRow.agent_name,
    },
    created=SessionRow.created_at,
    text=("rated",),  # yes | no: has feedback or a rewarded interaction
)


# a session's fields as the list and the detail both show them
SESSION_FIELDS = (
    "id", "project_id", "agent_name", "task_id", "client_protocol", "external_id", "status",
    "created_at", "last_activity_at",
)  # fmt: skip


def _session(s: SessionRow) -> dict[str, Any]:
    return fields(s, SESSION_FIELDS)


def sessions(db: Session, scope: Scope, f: Values, *, page: int = 1, size: int = PAGE_SIZE) -> Page:
    q = SESSION_FILTERS.narrow(select(SessionRow), scope, f)
    rated = f.get("rated")
    if rated in ("yes", "no"):
        has = or_(
            exists().where(FeedbackRow.session_id == SessionRow.id),
            exists().where(
                and_(InteractionRow.session_id == SessionRow.id, InteractionRow.reward.is_not(None))
            ),
        )
        q = q.where(has if rated == "yes" else ~has)
    rows, total = page_of(db, q, page, size, [SessionRow.created_at.desc(), SessionRow.id.desc()])
    ids = [r[0].id for r in rows]
    stats: dict[str, tuple[int, int, float | None]] = {}
    nfb: dict[str, int] = {}
    if ids:
        for sid, n, nr, mean in db.execute(
            select(
                InteractionRow.session_id,
                func.count(),
                func.count(InteractionRow.reward),
                func.avg(InteractionRow.reward),
            )
            .where(InteractionRow.session_id.in_(ids))
            .group_by(InteractionRow.session_id)
        ):
            stats[sid] = (int(n), int(nr), mean)
        for sid, n in db.execute(
            select(FeedbackRow.session_id, func.count())
            .where(FeedbackRow.session_id.in_(ids))
            .group_by(FeedbackRow.session_id)
        ):
            nfb[sid] = int(n)
    items = []
    for (s,) in rows:
        n, nr, mean = stats.get(s.id, (0, 0, None))
        items.append(
            {
                **_session(s),
                "interactions": n,
                "rated_interactions": nr,
                "feedback": nfb.get(s.id, 0),
                "mean_reward": float(mean) if mean is not None else None,
            }
        )
    return Page(items, total, page, size)


def agents(db: Session, scope: list[str] | None, limit: int = 100) -> list[str]:
    q = in_scope(select(SessionRow.agent_name), SessionRow.project_id, scope)
    q = q.where(SessionRow.agent_name.is_not(None)).distinct().limit(limit)
    return sorted(a for a in db.scalars(q) if a)


def session_detail(
    db: Session, scope: list[str] | None, session_id: str, decode: Any | None = None
) -> dict[str, Any] | None:
    s = db.get(SessionRow, session_id)
    if s is None or (scope is not None and s.project_id not in scope):
        return None
    rows = db.scalars(
        select(InteractionRow)
        .where(InteractionRow.session_id == session_id)
        .order_by(InteractionRow.seq, InteractionRow.choice_index)
    ).all()
    cache: dict[int, str] = {}
    turns = []
    prev: InteractionRow | None = None
    for r in rows:
        messages = request_messages(r.request or {}, r.id)
        shown_from = 0
        if prev is not None and r.parent_id == prev.id:
            shown_from = min(len(messages), len(request_messages(prev.request or {}, prev.id)) + 1)
        tokens = []
        if decode is not None:
            for tid, lp in zip(
                r.completion_token_ids[:MAX_TOKENS_SHOWN],
                r.completion_logprobs[:MAX_TOKENS_SHOWN],
                strict=False,
            ):
                if tid not in cache:
                    try:
                        cache[tid] = decode([tid])
                    except Exception:
                        cache[tid] = f"<{tid}>"
                p = math.exp(lp) if lp is not None and math.isfinite(lp) else 0.0
                tokens.append({"id": tid, "text": cache[tid], "logprob": lp, "p": p})
        output = r.output or {}
        turns.append(
            {
                "id": r.id,
                "seq": r.seq,
                "choice_index": r.choice_index,
                "parent_id": r.parent_id,
                "group_id": r.group_id,
                "policy_version": r.policy_version,
                "finish_reason": r.finish_reason,
                "created_at": r.created_at,
                "latency_ms": r.latency_ms,
                "reward": r.reward,
                "consumed_by_run_id": r.consumed_by_run_id,
                "temperature": r.temperature,
                "usage": r.usage,
                "messages": messages[shown_from:],
                "messages_hidden": shown_from,
                "output": {
                    "text": output.get("text"),
                    "reasoning": output.get("reasoning"),
                    "tool_calls": output.get("tool_calls") or [],
                },
                "tokens": tokens,
                "tokens_total": len(r.completion_token_ids),
                "tools": [
                    (t.get("function") or t).get("name")
                    for t in (r.request or {}).get("tools") or []
                    if isinstance(t, dict)
                ],
            }
        )
        prev = r
    fb = db.scalars(
        select(FeedbackRow)
        .where(FeedbackRow.session_id == session_id)
        .order_by(FeedbackRow.created_at)
        .limit(500)
    ).all()
    return {
        "session": {**_session(s), "closed_at": s.closed_at, "metadata": s.meta},
        "interactions": turns,
        "feedback": [_feedback(f) for f in fb],
    }


# ---- feedback -----------------------------------------------------------------------


FEEDBACK_FILTERS = Filters(
    equal={
        "project": FeedbackRow.project_id,
        "source": FeedbackRow.source,
        "target_type": FeedbackRow.target_type,
        "session_id": FeedbackRow.session_id,
    },
    created=FeedbackRow.created_at,
)


FEEDBACK_FIELDS = (
    "id", "project_id", "target_type", "target_id", "session_id", "value", "scale", "reward",
    "source", "rater", "comment", "created_at",
)  # fmt: skip


def _feedback(f: FeedbackRow) -> dict[str, Any]:
    return fields(f, FEEDBACK_FIELDS)


def feedback(db: Session, scope: Scope, f: Values, *, page: int = 1, size: int = PAGE_SIZE) -> Page:
    q = FEEDBACK_FILTERS.narrow(select(FeedbackRow), scope, f)
    rows, total = page_of(db, q, page, size, [FeedbackRow.created_at.desc(), FeedbackRow.id.desc()])
    return Page([_feedback(f) for (f,) in rows], total, page, size)
