"""Where each turn's credit came from (for the dashboard's session view, through
``trainer.api.session_credit``): the reward credit assignment gives every interaction of
a session (trainer/credit.py), the level that decided it (interaction, group, session
with its discount, or the unrated policy), and the ratings behind it with their origin
(:data:`ORIGINS`) and a judge's rationale and model; and a project's learning curve
(mean reward by policy version, and the eval gate's held-out score where configured)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.serving_version import BASE
from schemas.tables import (
    FeedbackRow,
    InteractionRow,
    PolicyVersionRow,
    ProjectRow,
    RunHintRow,
    SessionRow,
)
from trainer.credit import CreditConfig, Rating, aggregate, rater_key, session_turns

ORIGINS = {
    "user": "a client's rating",
    "verifier": "a verifier of the answer",
    "judge": "the LLM judge",
    "next_turn": "the LLM judge reading the user's next message",
    "next_turn_rules": "the rules reading the user's next message",
    "system": "rlgate itself",
}


def origin(row: FeedbackRow) -> str:
    """Where a rating came from (a key of :data:`ORIGINS`)."""
    if row.source == "judge" and (row.rater or "").endswith(":next_turn"):
        return "next_turn"
    if row.source == "next_turn":  # trainer/next_turn_rules.py
        return "next_turn_rules"
    return str(row.source)


def _rating_json(row: FeedbackRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "origin": origin(row),
        "origin_text": ORIGINS.get(origin(row)),
        "source": row.source,
        "rater": row.rater,
        "target_type": row.target_type,
        "target_id": row.target_id,
        "reward": row.reward,
        "comment": row.comment,
        "rationale": row.rationale,
        "judge_model": row.judge_model,
        "created_at": row.created_at.isoformat() if row.created_at else None,
    }


def session_credit(factory: sessionmaker[Session], session_id: str) -> dict[str, Any] | None:
    """Each interaction of the session in order: its stored ``reward``, the level that
    decides it and the ratings behind that level; None for an unknown session."""
    with factory() as db:
        srow = db.get(SessionRow, session_id)
        if srow is None:
            return None
        project = db.get(ProjectRow, srow.project_id)
        cfg = CreditConfig.of_project(project.settings if project is not None else None)
        rows = session_turns(db, session_id)
        fb = list(db.scalars(select(FeedbackRow).where(FeedbackRow.session_id == session_id)))
        closed = srow.status != "open"
        hints: dict[str, list[dict[str, Any]]] = {}
        for h in db.scalars(
            select(RunHintRow)
            .where(RunHintRow.interaction_id.in_([r.id for r in rows]))
            .order_by(RunHintRow.created_at)
        ):
            hints.setdefault(h.interaction_id, []).append(_hint_json(h))
    by_target: dict[tuple[str, str], list[FeedbackRow]] = {}
    for f in fb:
        by_target.setdefault((f.target_type, f.target_id), []).append(f)

    def agg(key: tuple[str, str]) -> float | None:
        return aggregate(
            Rating(f.target_type, f.target_id, float(f.reward), rater_key(f), (f.created_at, f.id))
            for f in by_target.get(key, [])
        )

    session_key = next((k for k in by_target if k[0] == "session"), None)
    turn_of: dict[str, int] = {}
    for r in rows:
        turn_of.setdefault(r.group_id or r.id, len(turn_of))
    last = len(turn_of) - 1
    out = []
    for r in rows:
        turn = turn_of[r.group_id or r.id]
        level, discount = "unrated", None
        key: tuple[str, str] | None = None
        candidates = [("interaction", r.id)] + ([("group", r.group_id)] if r.group_id else [])
        for k in candidates:
            if agg(k) is not None:
                level, key = k[0], k
                break
        if key is None and session_key is not None and agg(session_key) is not None:
            level, key, discount = "session", session_key, cfg.gamma ** (last - turn)
        if key is None and (cfg.unrated == "zero" or (cfg.unrated == "wait" and closed)):
            level = f"unrated:{cfg.unrated}"
        chosen = by_target.get(key, []) if key is not None else []
        ratings = sorted(chosen, key=lambda f: (f.created_at, f.id))
        out.append(
            {
                "interaction_id": r.id,
                "seq": r.seq,
                "turn": turn,
                "group_id": r.group_id,
                "reward": r.reward,
                "consumed": r.consumed_by_run_id is not None,
                "level": level,
                "discount": discount,
                "origins": sorted({origin(f) for f in ratings}),
                "ratings": [_rating_json(f) for f in ratings],
                "hints": hints.get(r.id, []),
            }
        )
    return {
        "session_id": session_id,
        "project_id": srow.project_id,
        "gamma": cfg.gamma,
        "unrated": cfg.unrated,
        "turns": out,
    }


def _hint_json(h: RunHintRow) -> dict[str, Any]:
    """A hint a run's teacher saw for this turn (trainer/hints.py)."""
    return {
        "run_id": h.run_id,
        "origin": h.origin,
        "text": h.text,
        "teacher": h.teacher,
        "adv_mean": h.adv_mean,
    }


def learning_curve(factory: sessionmaker[Session], project_id: str) -> list[dict[str, Any]]:
    """Per policy version that served the project (``base`` = 0), in order: requests,
    rated interactions, their mean reward, and the eval gate's held-out score of that
    version (``eval_new``) where an eval is configured."""
    with factory() as db:
        rows = db.execute(
            select(
                InteractionRow.policy_version,
                func.count(),
                func.count(InteractionRow.reward),
                func.avg(InteractionRow.reward),
                func.min(InteractionRow.created_at),
            )
            .where(InteractionRow.project_id == project_id)
            .group_by(InteractionRow.policy_version)
        ).all()
        versions = {
            v.name: v
            for v in db.scalars(
                select(PolicyVersionRow).where(PolicyVersionRow.project_id == project_id)
            )
        }
    out = []
    for name, requests, rated, mean, first in rows:
        pv = versions.get(name)
        metrics = (pv.eval_metrics or {}) if pv is not None else {}
        out.append(
            {
                "policy_version": name,
                "version": 0 if name == BASE else (pv.version if pv is not None else None),
                "requests": int(requests),
                "rated": int(rated),
                "mean_reward": float(mean) if mean is not None else None,
                "eval": metrics.get("eval_new"),
                "first_request_at": first.isoformat() if first else None,
            }
        )
    return sorted(out, key=lambda x: (x["version"] is None, x["version"] or 0))
