"""Feedback: parsing, normalization onto [-1, 1], target resolution, idempotent storing.

Everything that writes a ``feedback`` row goes through :func:`submit_feedback`: the
``POST /feedback`` route, the AReaL-compatible ``/rl/set_reward`` and the verifier task.
So every source produces the same records, and every stored rating is followed by credit
assignment (``trainer.credit``) for its session, keeping ``interactions.reward`` current.

Visibility: a caller sees the targets of its own project only (a per-session key: of its
own session only); the bootstrap admin key (``RLGATE_ADMIN_KEY``) sees every project. A
target the caller may not see is answered exactly like a missing one (404).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.keys import new_id
from gateway.auth import BOOTSTRAP_ADMIN_ID, Principal
from gateway.errors import APIError, bad_request
from gateway.storable import bounded_str
from schemas.atdp import Feedback
from schemas.coltypes import utcnow
from schemas.convert import to_record
from schemas.tables import FeedbackRow, InteractionRow, ProjectRow, SessionRow

log = logging.getLogger("rlgate.feedback")

# how long a feedback on an interaction id waits for the recorder to commit that row
TARGET_WAIT_S = 2.0
_POLL_S = 0.05

SCALES = {
    "binary": "binary",
    "thumbs": "binary",
    "stars-5": "stars-5",
    "stars5": "stars-5",
    "scalar": "scalar",
}
SOURCES = ("user", "verifier", "judge", "system")
_UP = {"up", "thumbs_up", "thumbs-up", "true"}
_DOWN = {"down", "thumbs_down", "thumbs-down", "false"}
FIELDS = {
    "interaction_id",
    "session_id",
    "session",
    "value",
    "scale",
    "min",
    "max",
    "comment",
    "rater",
    "source",
    "idempotency_key",
}
MAX_COMMENT = 10_000
MAX_SHORT = 200
MAX_ABS = 1e15  # bound on a scalar value, min and max: the arithmetic stays exact enough


class Unprocessable(APIError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(422, message, param=param)


# ---- normalization ----------------------------------------------------------------------


def _finite(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"'{param}' must be a number", param)
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float
        v = math.inf
    if not math.isfinite(v):
        raise bad_request(f"'{param}' must be a finite number", param)
    if abs(v) > MAX_ABS:
        raise bad_request(f"'{param}' must be between -{MAX_ABS:g} and {MAX_ABS:g}", param)
    return v


def canonical_scale(scale: Any) -> str:
    if not isinstance(scale, str) or scale.strip().lower() not in SCALES:
        raise bad_request("'scale' must be one of binary (or thumbs), stars-5, scalar", "scale")
    return SCALES[scale.strip().lower()]


def normalize(
    value: Any, scale: str, lo: Any = None, hi: Any = None
) -> tuple[float | bool, float, float | None, float | None]:
    """(value as stored, reward in [-1, 1], scale_min, scale_max) for a rating.

    Linear onto [-1, 1]: ``binary`` down/up -> -1/1; ``stars-5`` 1..5 -> -1..1;
    ``scalar`` min..max (default 0..1) -> -1..1. Out of range -> 422. Value, min and
    max must be finite and within +-1e15 (400), so the arithmetic cannot overflow and
    no NaN can become a reward.
    """
    scale = canonical_scale(scale)
    if scale != "scalar" and (lo is not None or hi is not None):
        raise bad_request("'min' and 'max' apply to the scalar scale only", "min")
    if scale == "binary":
        if isinstance(value, bool):
            up = value
        elif isinstance(value, int | float):
            if value == 1:
                up = True
            elif value in (0, -1):
                up = False
            else:
                raise Unprocessable(
                    f"binary value {value} is out of range: use true/false, 1/0, 1/-1, "
                    "up/down or thumbs_up/thumbs_down",
                    "value",
                )
        elif isinstance(value, str) and value.strip().lower() in _UP | _DOWN:
            up = value.strip().lower() in _UP
        else:
            raise Unprocessable(
                "binary value must be true/false, 1/0, 1/-1, up/down or thumbs_up/thumbs_down",
                "value",
            )
        return up, 1.0 if up else -1.0, None, None
    v = _finite(value, "value")
    if scale == "stars-5":
        if not 1 <= v <= 5:
            raise Unprocessable(f"stars-5 value {v:g} is out of range: use 1 to 5", "value")
        return v, _clip((v - 3.0) / 2.0), None, None
    low = 0.0 if lo is None else _finite(lo, "min")
    high = 1.0 if hi is None else _finite(hi, "max")
    if not high > low:
        raise bad_request(f"'max' ({high:g}) must be greater than 'min' ({low:g})", "max")
    if not low <= v <= high:
        raise Unprocessable(
            f"scalar value {v:g} is out of range: use {low:g} to {high:g} "
            "(or send 'min' and 'max')",
            "value",
        )
    return v, _clip(2.0 * ((v - low) / (high - low)) - 1.0), low, high


def _clip(x: float) -> float:
    """``x`` limited to [-1, 1]; a NaN is a 400, never a reward."""
    if math.isnan(x):
        raise bad_request("this rating does not map to a reward; check 'value', 'min', 'max'")
    return max(-1.0, min(1.0, x))


# ---- parsing ------------------------------------------------------------------------------


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


def parse_feedback(body: Any) -> FeedbackInput:
    """Check a ``POST /feedback`` body; 400 for a malformed one, 422 for a value out of range."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(
            f"unknown field '{unknown[0]}'; fields are {', '.join(sorted(FIELDS))}", unknown[0]
        )
    named = [k for k in ("interaction_id", "session_id", "session") if body.get(k) is not None]
    if len(named) != 1:
        raise bad_request(
            "name exactly one target: 'interaction_id', 'session_id', or \"session\": \"latest\"",
            named[1] if len(named) > 1 else "interaction_id",
        )
    field_name = named[0]
    ref = bounded_str(body, field_name, 128)
    if not ref:
        raise bad_request(f"'{field_name}' must be a non-empty string", field_name)
    if field_name == "interaction_id":
        target = "interaction"
    elif field_name == "session" and ref == "latest":
        target, ref = "latest", None
    else:
        target = "session"
    if "value" not in body or body["value"] is None:
        raise bad_request("'value' is required", "value")
    value = body["value"]
    scale = body.get("scale")
    if scale is None:
        scale = "binary" if isinstance(value, bool | str) else "scalar"
    stored, reward, lo, hi = normalize(value, scale, body.get("min"), body.get("max"))
    source = body.get("source") or "user"
    if source not in SOURCES:
        raise bad_request(f"'source' must be one of {', '.join(SOURCES)}", "source")
    return FeedbackInput(
        target=target,
        ref=ref,
        value=stored,
        scale=canonical_scale(scale),
        scale_min=lo,
        scale_max=hi,
        reward=reward,
        source=source,
        rater=bounded_str(body, "rater", MAX_SHORT),
        comment=bounded_str(body, "comment", MAX_COMMENT),
        idempotency_key=bounded_str(body, "idempotency_key", MAX_SHORT),
    )


# ---- targets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What a caller may rate: projects (None = all) and an optional fixed session."""

    project_id: str | None
    session_id: str | None = None
    key_id: str | None = None

    @classmethod
    def of(cls, p: Principal) -> Scope:
        if p.kind == "admin" and p.key_id == BOOTSTRAP_ADMIN_ID:
            return cls(None, None, p.key_id)
        return cls(p.project_id, p.session_id, p.key_id)

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
    gateway's routes pass 0 after waiting asynchronously (gateway.waits.locate); only
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
            f"idempotency key {inp.idempotency_key!r} was already used with a different body",
            param="idempotency_key",
        )
    return row


def _insert(
    factory: sessionmaker[Session], t: Target, inp: FeedbackInput, api_key_id: str | None
) -> tuple[FeedbackRow, bool]:
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


def submit_feedback(
    factory: sessionmaker[Session],
    inp: FeedbackInput,
    *,
    principal: Principal | None = None,
    scope: Scope | None = None,
    flush: Callable[[float], Any] | None = None,
    wait_s: float = TARGET_WAIT_S,
    after: bool = True,
) -> tuple[dict[str, Any], bool]:
    """Store one rating; returns (the feedback JSON, replayed).

    ``principal`` is the caller (None for trusted in-process callers such as verifiers,
    which pass a ``scope``). ``flush`` waits for this process's recorder so that a just
    answered interaction is in the database. After a new record: credit assignment for
    its session and, if the project says so, closing the session on a session rating.
    """
    if scope is None:
        scope = Scope.of(principal) if principal is not None else Scope(None)
    api_key_id = principal.key_id if principal is not None else None
    if inp.idempotency_key is not None and scope.project_id is not None:
        with factory() as db:
            earlier = _replay(db, scope.project_id, inp)
            if earlier is not None:
                return feedback_json(earlier), True
    if flush is not None and inp.target in ("interaction", "latest"):
        flush(wait_s)
    target = resolve_target(factory, scope, inp.target, inp.ref, wait_s)
    row, replayed = _insert(factory, target, inp, api_key_id)
    if not replayed and after:
        after_feedback(factory, row)
    return feedback_json(row), replayed


# ---- after a rating -----------------------------------------------------------------------


def project_settings(db: Session, project_id: str) -> dict[str, Any]:
    project = db.get(ProjectRow, project_id)
    return dict(project.settings or {}) if project is not None else {}


def after_feedback(factory: sessionmaker[Session], row: FeedbackRow) -> None:
    """Bring ``interactions.reward`` of the rated session up to date; close it on a session
    rating when the project has ``settings["close_session_on_rating"]``."""
    from trainer.credit import assign_rewards_tx

    if row.session_id is None:
        return
    closed = False
    if row.target_type == "session":
        with factory() as db, db.begin():
            if project_settings(db, row.project_id).get("close_session_on_rating"):
                closed = close_session(db, row.session_id)
    try:
        assign_rewards_tx(factory, row.project_id, row.session_id)
    except Exception:  # the rating is stored; the trainer's sweep assigns it later
        log.exception("credit assignment for session %s failed", row.session_id)
    if closed:
        session_closed(factory, row.session_id)


def close_session(db: Session, session_id: str, status: str = "closed") -> bool:
    """Mark an open session closed; True if it was open. Call :func:`session_closed`
    after the transaction commits."""
    row = db.get(SessionRow, session_id)
    if row is None or row.status != "open":
        return False
    row.status = status
    row.closed_at = utcnow()
    return True


def session_closed(factory: sessionmaker[Session], session_id: str) -> None:
    """The hook for every path that closes a session (end, idle expiry, rating)."""
    try:
        from trainer.verifiers import on_session_closed

        on_session_closed(factory, session_id)
    except Exception:
        log.exception("session-closed hook failed for %s", session_id)
