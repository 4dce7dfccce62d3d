"""Client retries: an SDK that timed out resends the same request, and the answer it never
received (the orphan) must not train as a trajectory of its own (AReaL drops such retry
orphans).

The OpenAI and Anthropic SDKs (Stainless-generated, Python and TypeScript) send
``x-stainless-retry-count`` with every request: 0 on the first attempt, the number of
retries taken on a resend; neither sends an idempotency key by default. A recorded call
with a retry count above 0 (``attempt``) supersedes the latest earlier answer to the same
prompt token ids from the same client - same session, or a session of the same API key
(a first turn's retry opens a new session) - recorded within ``RETRY_WINDOW``: that
answer gets ``superseded_by`` = the retry's id. Either may be recorded first (the orphan
keeps generating after its client left), so both orders are matched. Identical requests
without the header are never marked: sampling one prompt twice is ordinary in RL.
The trainer skips superseded answers, counted (trainer/data.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import literal_column, or_, select, update
from sqlalchemy.orm import Session, aliased

from schemas.tables import InteractionRow, SessionRow

RETRY_HEADER = "x-stainless-retry-count"
RETRY_WINDOW = timedelta(minutes=30)  # longer than an SDK's default timeout (10 min)


def client_attempt(headers: Mapping[str, str]) -> int:
    """The SDK's retry count of this request (0: first attempt, or not sent)."""
    raw = headers.get(RETRY_HEADER)
    try:
        return max(0, int(raw)) if raw is not None else 0
    except ValueError:
        return 0


def _when(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def mark_retries(db: Session, fresh: list[dict[str, Any]]) -> int:
    """Mark the orphans the just-inserted interactions ``fresh`` reveal (in the caller's
    transaction); returns how many were marked. One query when nothing is a retry."""
    marked = 0
    for r in fresh:  # a retry recorded after its orphan
        if int(r.get("attempt") or 0) > 0:
            marked += _supersede(db, r, before=True)
    late = [r["id"] for r in fresh if not int(r.get("attempt") or 0)]
    if not late:
        return marked
    oldest = min(_when(r["created_at"]) for r in fresh)
    retries = db.execute(  # an orphan recorded after its retry (rare: few rows)
        select(
            InteractionRow.id,
            InteractionRow.project_id,
            InteractionRow.session_id,
            InteractionRow.prompt_token_ids,
            InteractionRow.created_at,
            InteractionRow.attempt,
        ).where(
            InteractionRow.project_id.in_({r["project_id"] for r in fresh}),
            # a literal 0, so that a prepared statement's generic plan can still prove
            # ix_interactions_retries' condition (attempt > 0) and read only retries
            InteractionRow.attempt > literal_column("0"),
            InteractionRow.created_at >= oldest - RETRY_WINDOW,
        )
    ).all()
    for retry in retries:
        if not _claimed(db, retry.id):
            marked += _supersede(db, dict(retry._mapping), before=False, only=late)
    return marked


def _claimed(db: Session, retry_id: str) -> bool:
    hit = db.scalar(select(InteractionRow.id).where(InteractionRow.superseded_by == retry_id))
    return hit is not None


def _supersede(
    db: Session, retry: dict[str, Any], *, before: bool, only: list[str] | None = None
) -> int:
    """Mark the one answer ``retry`` replaced: an earlier attempt from the same client at
    the same prompt ids, recorded within the window (before the retry, or after it among
    ``only``), not already a retry's target."""
    at = _when(retry["created_at"])
    own = aliased(SessionRow)
    key = select(own.api_key_id).where(own.id == retry["session_id"]).scalar_subquery()
    span = (at - RETRY_WINDOW, at) if before else (at, at + RETRY_WINDOW)
    query = (
        select(InteractionRow.id)
        .join(SessionRow, SessionRow.id == InteractionRow.session_id)
        .where(
            InteractionRow.project_id == retry["project_id"],
            InteractionRow.id != retry["id"],
            InteractionRow.superseded_by.is_(None),
            InteractionRow.attempt < int(retry["attempt"]),
            InteractionRow.prompt_token_ids == list(retry["prompt_token_ids"]),
            InteractionRow.created_at.between(*span),
            or_(InteractionRow.session_id == retry["session_id"], SessionRow.api_key_id == key),
        )
        .order_by(InteractionRow.created_at.desc() if before else InteractionRow.created_at)
        .limit(1)
    )
    if only is not None:
        query = query.where(InteractionRow.id.in_(only))
    target = db.scalar(query)
    if target is None:
        return 0
    db.execute(
        update(InteractionRow).where(InteractionRow.id == target).values(superseded_by=retry["id"])
    )
    return 1
