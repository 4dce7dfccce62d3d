"""Feedback records: the one place a ``feedback`` row is written.

:func:`store_feedback` resolves what a rating names (an interaction, a group, a session,
or the caller's latest session) within what the caller may see (:class:`Scope`), and
stores it idempotently. Its callers: the gateway's ``POST /feedback`` and AReaL
``/rl/set_reward`` (gateway/routes/feedback.py parses and normalizes the body) and the verifier
task (trainer/hooks.py). Each then runs trainer.hooks.after_feedback on a new record.

Visibility: a caller sees the targets of its own project only (a per-session key: of its
own session only); an unscoped caller (the bootstrap admin key, trusted in-process
callers) sees every project. A target the caller may not see is answered exactly like a
missing one (404).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.errors import APIError
from core.feedback_rules import check_system_key, shown_key
from core.keys import new_id
from schemas.atdp import Feedback, SessionStatus
from schemas.coltypes import utcnow
from schemas.convert import to_record
from schemas.tables import FeedbackRow, InteractionRow, ProjectRow, SessionRow

# how long a feedback on an interaction id waits for the recorder to commit that row
TARGET_WAIT_S = 2.0
_POLL_S = 0.05


# ---- the rating -----------------------------------------------------------------------------


@dataclass
class FeedbackInput:
    target: str  # interaction | session | latest
    ref: str | None
    value: float | bool
    scale: str
    scale_min: float | None
    scale_max: float | None
    reward: float
    source: str = "user"
    rater: str | None = None
    comment: str | None = None
    idempotency_key: str | None = None
    rationale: str | None = None  # a judge's reasons (source "judge")
    judge_model: str | None = None  # the model that judged

    @property
    def request_hash(self) -> str:
        """Fingerprint of what the request means (target, normalized value, scale, text
        fields): the same rating sent twice, in any key order or spelling of the same
        value, has the same hash."""
        meaning = [
            self.target,
            self.ref,
            float(self.value),
            self.scale,
            self.scale_min,
            self.scale_max,
            self.source,
            self.rater,
            self.comment,
            self.idempotency_key,
        ]
        data = json.dumps(meaning, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(data.encode()).hexdigest()


# ---- targets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What a caller may rate: projects (None = all) and an optional fixed session."""

    project_id: str | None
    session_id: str | None = None
    key_id: str | None = None

    def sees(self, project_id: str, session_id: str) -> bool:
        if self.project_id is not None and project_id != self.project_id:
            return False
        return self.session_id is None or session_id == self.session_id


@dataclass(frozen=True)
class Target:
    project_id: str
    target_type: str  # interaction | group | session
    target_id: str
    session_id: str


def _find_interaction(db: Session, scope: Scope, ref: str) -> Target | None:
    row = db.execute(
        select(InteractionRow.project_id, InteractionRow.session_id).where(InteractionRow.id == ref)
    ).first()
    if row is not None:
        if scope.sees(row[0], row[1]):
            return Target(row[0], "interaction", ref, row[1])
        return None
    hit = db.execute(
        select(InteractionRow.project_id, InteractionRow.session_id)
        .where(InteractionRow.group_id == ref)
        .limit(1)
    ).first()
    if hit is not None and scope.sees(hit[0], hit[1]):
        return Target(hit[0], "group", ref, hit[1])
    return None


def find_interaction(factory: sessionmaker[Session], scope: Scope, ref: str) -> Target | None:
    """The interaction (or group) ``ref`` if it is committed and the caller may see it."""
    with factory() as db:
        return _find_interaction(db, scope, ref)


def resolve_target(
    factory: sessionmaker[Session], scope: Scope, target: str, ref: str | None, wait_s: float
) -> Target:
    """The row a feedback names; 404 (the same for missing and not visible) otherwise.

    An interaction id may name a row the recorder has not committed yet (the client got
    the response a moment ago): it is looked up again for up to ``wait_s`` seconds. The
    gateway's routes pass 0 after waiting asynchronously (gateway.routes.waits.locate); only
    in-process callers outside the event loop (verifiers) block here.
    """
    if target == "latest":
        with factory() as db:
            if scope.session_id is not None:
                row = db.get(SessionRow, scope.session_id)
            else:
                row = db.scalars(
                    select(SessionRow)
                    .where(SessionRow.api_key_id == scope.key_id)
                    .order_by(
                        SessionRow.last_activity_at.desc(),
                        SessionRow.created_at.desc(),
                        SessionRow.id.desc(),
                    )
                    .limit(1)
                ).first()
            if row is None:
                raise APIError(404, "this key has no session yet", param="session")
            return Target(row.project_id, "session", row.id, row.id)
    assert ref is not None
    if target == "session":
        with factory() as db:
            row = db.get(SessionRow, ref)
            if row is None or not scope.sees(row.project_id, row.id):
                raise APIError(404, f"no session {ref}", param="session_id")
            return Target(row.project_id, "session", row.id, row.id)
    deadline = time.monotonic() + wait_s
    while True:
        with factory() as db:
            found = _find_interaction(db, scope, ref)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise APIError(404, f"no interaction {ref}", param="interaction_id")
        time.sleep(_POLL_S)


# ---- storing ------------------------------------------------------------------------------


def feedback_json(row: FeedbackRow) -> dict[str, Any]:
    out = to_record(row).model_dump(mode="json")
    out["idempotency_key"] = shown_key(out.get("idempotency_key"))
    out["object"] = "feedback"
    return out


def _replay(db: Session, project_id: str, inp: FeedbackInput) -> FeedbackRow | None:
    """The earlier record with this idempotency key, or None; 409 if its body differed."""
    if inp.idempotency_key is None:
        return None
    row = db.scalars(
        select(FeedbackRow).where(
            FeedbackRow.project_id == project_id,
            FeedbackRow.idempotency_key == inp.idempotency_key,
        )
    ).first()
    if row is not None and row.request_hash != inp.request_hash:
        raise APIError(
            409,
            f"idempotency key {shown_key(inp.idempotency_key)!r} was already used with a "
            "different body",
            param="idempotency_key",
        )
    return row


def _insert(
    factory: sessionmaker[Session], t: Target, inp: FeedbackInput, api_key_id: str | None
) -> tuple[FeedbackRow, bool]:
    check_system_key(inp.source, inp.idempotency_key)
    try:
        with factory() as db, db.begin():
            earlier = _replay(db, t.project_id, inp)
            if earlier is not None:
                return earlier, True
            row = FeedbackRow(
                id=new_id("fb"),
                project_id=t.project_id,
                target_type=t.target_type,
                target_id=t.target_id,
                session_id=t.session_id,
                value=inp.value,
                scale=inp.scale,
                scale_min=inp.scale_min,
                scale_max=inp.scale_max,
                reward=inp.reward,
                source=inp.source,
                rater=inp.rater,
                comment=inp.comment,
                idempotency_key=inp.idempotency_key,
                request_hash=inp.request_hash,
                api_key_id=api_key_id,
                created_at=utcnow(),
                rationale=inp.rationale,
                judge_model=inp.judge_model,
            )
            Feedback.model_validate(feedback_json_values(row))  # the ATDP contract holds
            db.add(row)
            return row, False
    except IntegrityError:
        # a concurrent request with the same idempotency key won the insert
        with factory() as db:
            earlier = _replay(db, t.project_id, inp)
            if earlier is None:
                raise
            return earlier, True


def feedback_json_values(row: FeedbackRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in Feedback.model_fields if name != "atdp_version"}


def store_feedback(
    factory: sessionmaker[Session],
    inp: FeedbackInput,
    scope: Scope,
    *,
    api_key_id: str | None = None,
    flush: Callable[[float], Any] | None = None,
    wait_s: float = TARGET_WAIT_S,
) -> tuple[FeedbackRow, bool]:
    """Store one rating; returns (the row, replayed).

    ``replayed`` is True when the idempotency key names an earlier record (returned
    instead). ``flush`` waits for the calling process's recorder so that a just answered
    interaction is in the database. What follows a new record (credit assignment, closing
    the session) is the caller's: trainer.hooks.after_feedback.
    """
    if inp.idempotency_key is not None and scope.project_id is not None:
        with factory() as db:
            earlier = _replay(db, scope.project_id, inp)
            if earlier is not None:
                return earlier, True
    if flush is not None and inp.target in ("interaction", "latest"):
        flush(wait_s)
    target = resolve_target(factory, scope, inp.target, inp.ref, wait_s)
    return _insert(factory, target, inp, api_key_id)


# ---- sessions and projects ---------------------------------------------------------------


def project_settings(db: Session, project_id: str) -> dict[str, Any]:
    project = db.get(ProjectRow, project_id)
    return dict(project.settings or {}) if project is not None else {}


def close_session(db: Session, session_id: str, status: str = SessionStatus.closed) -> bool:
    """Mark an open session closed; True if it was open. Call the session-closed hook
    (trainer.hooks.on_session_closed) after the transaction commits."""
    row = db.get(SessionRow, session_id)
    if row is None or row.status != SessionStatus.open:
        return False
    row.status = status
    row.closed_at = utcnow()
    return True
