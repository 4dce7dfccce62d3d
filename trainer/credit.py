"""Credit assignment: feedback rows -> ``interactions.reward``.

The trainer reads only ``interactions.reward IS NOT NULL AND consumed_by_run_id IS NULL``;
this module is what writes that column. The rules (documented in docs/feedback.md):

- Ratings of one target (an interaction, an n>1 group, or a session) are aggregated: the
  latest rating per rater counts (a rater is ``source`` + ``rater``, or the API key when no
  ``rater`` is named), then the mean of those.
- Interaction feedback rewards that interaction; group feedback rewards every member.
- Session feedback rewards the session's last turn and flows back with the turn discount
  gamma: turn k from the end gets ``gamma**k * r``. A turn is one request: the members of
  an n>1 group share a turn.
- The most specific rating wins: interaction > group > session. (No sums.)
- Interactions no rating reaches follow ``unrated``: ``skip`` (reward stays NULL, not
  trained), ``zero`` (reward 0), ``wait`` (NULL while the session is open; 0 once it is
  closed or expired).

Per project: ``Project.settings["credit_assignment"] = {"gamma": 1.0, "unrated": "skip"}``
(the defaults; gamma must be in [0, 1]). Consumed interactions are never changed, and
running it again changes nothing (idempotent): rewards are recomputed from the feedback
rows, not accumulated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from schemas.atdp import SessionStatus
from schemas.tables import FeedbackRow, InteractionRow, ProjectRow, SessionRow

log = logging.getLogger("rlgate.credit")

UNRATED_POLICIES = ("skip", "zero", "wait")


@dataclass(frozen=True)
class CreditConfig:
    gamma: float = 1.0
    unrated: str = "skip"

    @classmethod
    def parse(cls, raw: Any) -> CreditConfig:
        """The config from ``settings["credit_assignment"]``; ValueError if invalid."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError("credit_assignment must be an object")
        gamma = raw.get("gamma", 1.0)
        if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 <= gamma <= 1:
            raise ValueError("credit_assignment.gamma must be a number in [0, 1]")
        unrated = raw.get("unrated", "skip")
        if unrated not in UNRATED_POLICIES:
            raise ValueError(f"credit_assignment.unrated must be one of {UNRATED_POLICIES}")
        return cls(float(gamma), unrated)

    @classmethod
    def of_project(cls, settings: dict[str, Any] | None) -> CreditConfig:
        try:
            return cls.parse((settings or {}).get("credit_assignment"))
        except ValueError as e:
            log.warning("invalid project setting (%s); using the defaults", e)
            return cls()


@dataclass(frozen=True)
class Rating:
    """What credit assignment needs of one feedback row."""

    target_type: str
    target_id: str
    reward: float
    rater: str
    order: tuple[Any, str]  # (created_at, id): later wins


@dataclass(frozen=True)
class Turn:
    """What credit assignment needs of one interaction row."""

    id: str
    seq: int
    group_id: str | None


def rater_key(row: FeedbackRow) -> str:
    who = row.rater if row.rater is not None else f"key:{row.api_key_id or ''}"
    return f"{row.source}:{who}"


def aggregate(ratings: Iterable[Rating]) -> float | None:
    """Latest rating per rater, then the mean; None when there is none."""
    latest: dict[str, Rating] = {}
    for r in ratings:
        cur = latest.get(r.rater)
        if cur is None or r.order > cur.order:
            latest[r.rater] = r
    if not latest:
        return None
    return sum(r.reward for r in latest.values()) / len(latest)


def _clip(x: float) -> float:
    return max(-1.0, min(1.0, x))


def session_rewards(
    interactions: list[Turn], ratings: list[Rating], cfg: CreditConfig, closed: bool
) -> dict[str, float | None]:
    """The reward of every interaction of one session (pure; no database)."""
    by_target: dict[tuple[str, str], list[Rating]] = {}
    for r in ratings:
        by_target.setdefault((r.target_type, r.target_id), []).append(r)
    agg = {k: aggregate(v) for k, v in by_target.items()}
    session_r = next((v for (t, _), v in agg.items() if t == "session"), None)

    # turns in order: one per request (an n>1 group is one turn)
    turn_of: dict[str, int] = {}
    turns: list[str] = []
    for it in sorted(interactions, key=lambda i: i.seq):
        key = it.group_id or it.id
        if key not in turn_of:
            turn_of[key] = len(turns)
            turns.append(key)
    last = len(turns) - 1

    out: dict[str, float | None] = {}
    for it in interactions:
        value = agg.get(("interaction", it.id))
        if value is None and it.group_id is not None:
            value = agg.get(("group", it.group_id))
        if value is None and session_r is not None:
            k = last - turn_of[it.group_id or it.id]
            value = (cfg.gamma**k) * session_r
        if value is None and (cfg.unrated == "zero" or (cfg.unrated == "wait" and closed)):
            value = 0.0
        out[it.id] = None if value is None else _clip(value)
    return out


def _lock_session(db: Session, session_id: str) -> None:
    """Serialize credit assignment per session: a no-op UPDATE takes the row lock on
    PostgreSQL and the write lock on SQLite before anything is read."""
    db.execute(
        update(SessionRow).where(SessionRow.id == session_id).values(status=SessionRow.status)
    )


def session_turns(db: Session, session_id: str) -> list[Any]:
    """The session's interactions in order: id, seq, group_id, reward, consumed_by_run_id
    (what credit assignment and its explanation, trainer/credit_view.py, read)."""
    q = select(
        InteractionRow.id,
        InteractionRow.seq,
        InteractionRow.group_id,
        InteractionRow.reward,
        InteractionRow.consumed_by_run_id,
    ).where(InteractionRow.session_id == session_id)
    return list(db.execute(q.order_by(InteractionRow.seq)).all())


def _assign_session(db: Session, session_id: str, cfg: CreditConfig) -> int:
    _lock_session(db, session_id)
    status = db.scalar(select(SessionRow.status).where(SessionRow.id == session_id))
    if status is None:
        return 0
    rows = session_turns(db, session_id)
    if not rows:
        return 0
    fb = db.execute(
        select(
            FeedbackRow.id,
            FeedbackRow.target_type,
            FeedbackRow.target_id,
            FeedbackRow.reward,
            FeedbackRow.source,
            FeedbackRow.rater,
            FeedbackRow.api_key_id,
            FeedbackRow.created_at,
        ).where(FeedbackRow.session_id == session_id)
    ).all()
    ratings = [
        Rating(f.target_type, f.target_id, float(f.reward), rater_key(f), (f.created_at, f.id))
        for f in fb
    ]
    turns = [Turn(r.id, r.seq, r.group_id) for r in rows]
    rewards = session_rewards(turns, ratings, cfg, closed=status != SessionStatus.open)
    changed = 0
    for r in rows:
        new = rewards[r.id]
        if r.consumed_by_run_id is not None or r.reward == new:
            continue
        res = db.execute(
            update(InteractionRow)
            .where(InteractionRow.id == r.id, InteractionRow.consumed_by_run_id.is_(None))
            .values(reward=new)
        )
        changed += res.rowcount or 0
    return changed


def unconsumed_sessions(db: Session, project_id: str) -> list[str]:
    """The project's sessions that still have an interaction no run has consumed, sorted."""
    return sorted(
        db.scalars(
            select(InteractionRow.session_id)
            .where(
                InteractionRow.project_id == project_id,
                InteractionRow.consumed_by_run_id.is_(None),
            )
            .distinct()
        ).all()
    )


def assign_rewards(db: Session, project_id: str, session_id: str | None = None) -> int:
    """Write ``interactions.reward`` for the not-yet-consumed interactions of one session,
    or of every session of the project that has some; returns how many rows changed.
    Runs in the caller's transaction (the caller commits)."""
    project = db.get(ProjectRow, project_id)
    cfg = CreditConfig.of_project(project.settings if project is not None else None)
    if session_id is not None:
        owner = db.scalar(select(SessionRow.project_id).where(SessionRow.id == session_id))
        if owner != project_id:
            return 0
        sessions = [session_id]
    else:
        sessions = unconsumed_sessions(db, project_id)
    return sum(_assign_session(db, sid, cfg) for sid in sessions)


def assign_rewards_tx(
    factory: sessionmaker[Session], project_id: str, session_id: str | None = None
) -> int:
    """:func:`assign_rewards` with one short transaction per session (for sweeps: the
    trainer can call ``assign_rewards_tx(factory, project_id)`` before selecting)."""
    if session_id is not None:
        with factory() as db, db.begin():
            return assign_rewards(db, project_id, session_id)
    with factory() as db:
        sessions = unconsumed_sessions(db, project_id)
    total = 0
    for sid in sessions:
        with factory() as db, db.begin():
            total += assign_rewards(db, project_id, sid)
    return total
