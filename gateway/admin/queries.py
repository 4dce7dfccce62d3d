"""Read-side queries of the dashboard; every list is paged in SQL (LIMIT/OFFSET plus one
COUNT), so a project with millions of rows renders one page at a time.

``projects`` is the caller's scope: ``None`` for the bootstrap admin (every project), else
the list of project ids an admin key may see (its own project).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, exists, func, or_, select
from sqlalchemy.orm import Session

from schemas.coltypes import utcnow
from schemas.tables import (
    ApiKeyRow,
    AuditEventRow,
    FeedbackRow,
    InteractionRow,
    PolicyVersionRow,
    ProjectRow,
    SessionRow,
    TrainingRunRow,
)

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_TOKENS_SHOWN = 4000
STEP_METRICS = (
    ("loss", "loss"),
    ("reward_mean", "reward mean"),
    ("kl", "KL to the base model"),
    ("kl_prox", "KL to the proximal policy (trust region)"),
    ("entropy", "entropy"),
    ("clip_frac", "clip fraction"),
    ("masked_frac", "masked fraction"),
    ("masked_stale_frac", "masked: stale samples"),
    ("masked_mismatch_frac", "masked: engine/trainer mismatch"),
    ("tokens_per_s", "tokens/s"),
)


@dataclass
class Page:
    items: list[dict[str, Any]]
    total: int
    page: int
    size: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    def as_json(self) -> dict[str, Any]:
        return {
            "items": jsonable(self.items),
            "total": self.total,
            "page": self.page,
            "page_size": self.size,
            "pages": self.pages,
        }


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _scope(q: Select, col: Any, projects: list[str] | None) -> Select:
    return q if projects is None else q.where(col.in_(projects))


def _page(db: Session, q: Select, page: int, size: int, order: list[Any]) -> tuple[list, int]:
    total = db.scalar(select(func.count()).select_from(q.order_by(None).subquery())) or 0
    rows = db.execute(q.order_by(*order).limit(size).offset((page - 1) * size)).all()
    return rows, int(total)


def _dur(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or utcnow()) - start).total_seconds()


# ---- overview -----------------------------------------------------------------------


def projects(db: Session, scope: list[str] | None) -> list[str]:
    q = _scope(select(ProjectRow.id), ProjectRow.id, scope).order_by(ProjectRow.id)
    return list(db.scalars(q))


def overview(db: Session, scope: list[str] | None, hours: int = 24) -> dict[str, Any]:
    now = utcnow()
    out = []
    for p in db.scalars(_scope(select(ProjectRow), ProjectRow.id, scope).order_by(ProjectRow.id)):
        serving = db.scalars(
            select(PolicyVersionRow).where(
                PolicyVersionRow.project_id == p.id, PolicyVersionRow.status == "serving"
            )
        ).first()
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
            .where(SessionRow.project_id == p.id, SessionRow.status == "open")
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
                "last_run": _run_summary(db, last_run) if last_run else None,
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
        n, rated, mean = db.execute(_scope(q, InteractionRow.project_id, scope)).one()
        fq = (
            select(func.count())
            .select_from(FeedbackRow)
            .where(FeedbackRow.created_at >= a, FeedbackRow.created_at < b)
        )
        nf = db.scalar(_scope(fq, FeedbackRow.project_id, scope))
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


def sessions(
    db: Session,
    scope: list[str] | None,
    *,
    project: str | None = None,
    status: str | None = None,
    rated: str | None = None,
    agent: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    page: int = 1,
    size: int = PAGE_SIZE,
) -> Page:
    q = _scope(select(SessionRow), SessionRow.project_id, scope)
    if project:
        q = q.where(SessionRow.project_id == project)
    if status:
        q = q.where(SessionRow.status == status)
    if agent:
        q = q.where(SessionRow.agent_name == agent)
    if since:
        q = q.where(SessionRow.created_at >= since)
    if until:
        q = q.where(SessionRow.created_at < until)
    if rated in ("yes", "no"):
        has = or_(
            exists().where(FeedbackRow.session_id == SessionRow.id),
            exists().where(
                and_(InteractionRow.session_id == SessionRow.id, InteractionRow.reward.is_not(None))
            ),
        )
        q = q.where(has if rated == "yes" else ~has)
    rows, total = _page(db, q, page, size, [SessionRow.created_at.desc(), SessionRow.id.desc()])
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
                "id": s.id,
                "project_id": s.project_id,
                "agent_name": s.agent_name,
                "task_id": s.task_id,
                "client_protocol": s.client_protocol,
                "external_id": s.external_id,
                "status": s.status,
                "created_at": s.created_at,
                "last_activity_at": s.last_activity_at,
                "interactions": n,
                "rated_interactions": nr,
                "feedback": nfb.get(s.id, 0),
                "mean_reward": float(mean) if mean is not None else None,
            }
        )
    return Page(items, total, page, size)


def agents(db: Session, scope: list[str] | None, limit: int = 100) -> list[str]:
    q = _scope(select(SessionRow.agent_name), SessionRow.project_id, scope)
    q = q.where(SessionRow.agent_name.is_not(None)).distinct().limit(limit)
    return sorted(a for a in db.scalars(q) if a)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "tool_result":
                parts.append(_content_text(part.get("content")))
            else:
                parts.append(json.dumps(part, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def request_messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation a request carried, normalised to role / text / tool calls for
    display (OpenAI chat ``messages``, Anthropic ``system`` + ``messages``, Responses
    ``instructions`` + ``input``)."""
    out: list[dict[str, Any]] = []
    for key in ("system", "instructions"):
        if req.get(key):
            out.append({"role": "system", "text": _content_text(req[key]), "tool_calls": []})
    msgs = req.get("messages")
    if msgs is None:
        msgs = req.get("input")
    if isinstance(msgs, str):
        msgs = [{"role": "user", "content": msgs}]
    for m in msgs or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role") or m.get("type") or "?"
        calls = [
            {
                "id": c.get("id"),
                "name": (c.get("function") or {}).get("name", c.get("name")),
                "arguments": (c.get("function") or {}).get("arguments", c.get("arguments")),
            }
            for c in m.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        content = m.get("content")
        if content is None and "output" in m:  # Responses function_call_output
            content = m.get("output")
        if isinstance(content, list):  # Anthropic tool_use blocks are calls
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    calls.append(
                        {
                            "id": block.get("id"),
                            "name": block.get("name"),
                            "arguments": json.dumps(block.get("input"), ensure_ascii=False),
                        }
                    )
            content = [
                b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_use")
            ]
        out.append(
            {
                "role": role,
                "text": _content_text(content),
                "tool_calls": calls,
                "tool_call_id": m.get("tool_call_id") or m.get("call_id"),
                "name": m.get("name"),
            }
        )
    return out


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
        messages = request_messages(r.request or {})
        shown_from = 0
        if prev is not None and r.parent_id == prev.id:
            shown_from = min(len(messages), len(request_messages(prev.request or {})) + 1)
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
        "session": {
            "id": s.id,
            "project_id": s.project_id,
            "agent_name": s.agent_name,
            "task_id": s.task_id,
            "client_protocol": s.client_protocol,
            "external_id": s.external_id,
            "status": s.status,
            "created_at": s.created_at,
            "last_activity_at": s.last_activity_at,
            "closed_at": s.closed_at,
            "metadata": s.meta,
        },
        "interactions": turns,
        "feedback": [_feedback(f) for f in fb],
    }


# ---- feedback -----------------------------------------------------------------------


def _feedback(f: FeedbackRow) -> dict[str, Any]:
    return {
        "id": f.id,
        "project_id": f.project_id,
        "target_type": f.target_type,
        "target_id": f.target_id,
        "session_id": f.session_id,
        "value": f.value,
        "scale": f.scale,
        "reward": f.reward,
        "source": f.source,
        "rater": f.rater,
        "comment": f.comment,
        "created_at": f.created_at,
    }


def feedback(
    db: Session,
    scope: list[str] | None,
    *,
    project: str | None = None,
    source: str | None = None,
    target_type: str | None = None,
    session_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    page: int = 1,
    size: int = PAGE_SIZE,
) -> Page:
    q = _scope(select(FeedbackRow), FeedbackRow.project_id, scope)
    if project:
        q = q.where(FeedbackRow.project_id == project)
    if source:
        q = q.where(FeedbackRow.source == source)
    if target_type:
        q = q.where(FeedbackRow.target_type == target_type)
    if session_id:
        q = q.where(FeedbackRow.session_id == session_id)
    if since:
        q = q.where(FeedbackRow.created_at >= since)
    if until:
        q = q.where(FeedbackRow.created_at < until)
    rows, total = _page(db, q, page, size, [FeedbackRow.created_at.desc(), FeedbackRow.id.desc()])
    return Page([_feedback(f) for (f,) in rows], total, page, size)


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


def _run_summary(db: Session, r: TrainingRunRow, pv: PolicyVersionRow | None = None) -> dict:
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
        "duration_s": _dur(r.started_at, r.finished_at),
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


def runs(
    db: Session,
    scope: list[str] | None,
    *,
    project: str | None = None,
    status: str | None = None,
    trigger: str | None = None,
    page: int = 1,
    size: int = PAGE_SIZE,
) -> Page:
    q = _scope(select(TrainingRunRow), TrainingRunRow.project_id, scope)
    if project:
        q = q.where(TrainingRunRow.project_id == project)
    if status:
        q = q.where(TrainingRunRow.status == status)
    if trigger:
        q = q.where(TrainingRunRow.trigger == trigger)
    rows, total = _page(
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
    items = [_run_summary(db, r, pvs.get(r.policy_version_id or "")) for (r,) in rows]
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
    rows, total = _page(db, q, page, size, [InteractionRow.created_at, InteractionRow.id])
    out = _run_summary(db, r, pv)
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
    q = _scope(select(PolicyVersionRow), PolicyVersionRow.project_id, scope)
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


def keys(
    db: Session,
    scope: list[str] | None,
    *,
    project: str | None = None,
    kind: str | None = None,
    include_revoked: bool = False,
    include_session_keys: bool = False,
    page: int = 1,
    size: int = PAGE_SIZE,
) -> Page:
    q = _scope(select(ApiKeyRow), ApiKeyRow.project_id, scope)
    if project:
        q = q.where(ApiKeyRow.project_id == project)
    if kind:
        q = q.where(ApiKeyRow.kind == kind)
    if not include_revoked:
        q = q.where(ApiKeyRow.revoked_at.is_(None))
    if not include_session_keys:
        q = q.where(ApiKeyRow.session_id.is_(None))
    rows, total = _page(db, q, page, size, [ApiKeyRow.created_at.desc(), ApiKeyRow.id.desc()])
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
