"""Feedback from clients: parsing, normalization onto [-1, 1], the caller's scope.

Everything that writes a ``feedback`` row goes through core.feedback.store_feedback: the
``POST /feedback`` route and the AReaL-compatible ``/rl/set_reward`` (both through
:func:`submit_feedback` here) and the verifier task (trainer/hooks.py). So every source
produces the same records, and every stored rating is followed by credit assignment
(trainer.hooks.after_feedback, reached through trainer.api) for its session, keeping
``interactions.reward`` current.

Visibility: a caller sees the targets of its own project only (a per-session key: of its
own session only); the bootstrap admin key (``RLGATE_ADMIN_KEY``) sees every project. A
target the caller may not see is answered exactly like a missing one (404).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.errors import APIError
from core.feedback import (
    TARGET_WAIT_S,
    FeedbackInput,
    Scope,
    feedback_json,
    project_settings,
    store_feedback,
)
from core.feedback_rules import CLIENT_KEY_PREFIX, CLIENT_SOURCE, agent_keys_rate, client_key
from gateway.edge.auth import BOOTSTRAP_ADMIN_ID, Principal
from gateway.edge.errors import bad_request
from gateway.edge.storable import bounded_str
from schemas.atdp import FeedbackSource

SCALES = {
    "binary": "binary",
    "thumbs": "binary",
    "stars-5": "stars-5",
    "stars5": "stars-5",
    "scalar": "scalar",
}
SOURCES = tuple(s.value for s in FeedbackSource)  # one list: schemas/atdp.py
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
MAX_CLIENT_KEY = MAX_SHORT - len(CLIENT_KEY_PREFIX)  # stored with the prefix in 200
MAX_ABS = 1e15  # bound on a scalar value, min and max: the arithmetic stays exact enough


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
    ``scalar`` min..max (default 0..1) -> -1..1. Out of range -> 400, as every other
    bad body (the value names its range). Value, min and max must be finite and within
    +-1e15, so the arithmetic cannot overflow and no NaN can become a reward.
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
                raise bad_request(
                    f"binary value {value} is out of range: use true/false, 1/0, 1/-1, "
                    "up/down or thumbs_up/thumbs_down",
                    "value",
                )
        elif isinstance(value, str) and value.strip().lower() in _UP | _DOWN:
            up = value.strip().lower() in _UP
        else:
            raise bad_request(
                "binary value must be true/false, 1/0, 1/-1, up/down or thumbs_up/thumbs_down",
                "value",
            )
        return up, 1.0 if up else -1.0, None, None
    v = _finite(value, "value")
    if scale == "stars-5":
        if not 1 <= v <= 5:
            raise bad_request(f"stars-5 value {v:g} is out of range: use 1 to 5", "value")
        return v, _clip((v - 3.0) / 2.0), None, None
    low = 0.0 if lo is None else _finite(lo, "min")
    high = 1.0 if hi is None else _finite(hi, "max")
    if not high > low:
        raise bad_request(f"'max' ({high:g}) must be greater than 'min' ({low:g})", "max")
    if not low <= v <= high:
        raise bad_request(
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


def parse_feedback(body: Any) -> FeedbackInput:
    """Check a ``POST /feedback`` body; 400 for a malformed one or a value out of range."""
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
    source = body.get("source")
    if source is not None and source != CLIENT_SOURCE:
        if source in SOURCES:  # the system's: verifier, judge, next_turn, ... (any but user)
            raise APIError(
                403,
                f"'source' {source!r} is written by rlgate's worker only; a client rates as "
                "'user' (omit 'source')",
                param="source",
            )
        raise bad_request("'source' must be 'user' (or omitted)", "source")
    return FeedbackInput(
        target=target,
        ref=ref,
        value=stored,
        scale=canonical_scale(scale),
        scale_min=lo,
        scale_max=hi,
        reward=reward,
        source=CLIENT_SOURCE,
        rater=bounded_str(body, "rater", MAX_SHORT),
        comment=bounded_str(body, "comment", MAX_COMMENT),
        # the clients' own namespace: no client can name a key the worker writes
        idempotency_key=client_key(bounded_str(body, "idempotency_key", MAX_CLIENT_KEY)),
    )


# ---- the caller's scope and storing ---------------------------------------------------------


def scope_of(p: Principal) -> Scope:
    """What this caller may rate: the bootstrap admin key every project, any other key
    its own project (a per-session key: its own session)."""
    if p.kind == "admin" and p.key_id == BOOTSTRAP_ADMIN_ID:
        return Scope(None, None, p.key_id)
    return Scope(p.project_id, p.session_id, p.key_id)


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

    ``principal`` is the caller (None for trusted in-process callers, which pass a
    ``scope``). ``flush`` waits for this process's recorder so that a just answered
    interaction is in the database. After a new record: credit assignment for its session
    and, if the project says so, closing the session on a session rating.
    """
    if scope is None:
        scope = scope_of(principal) if principal is not None else Scope(None)
    api_key_id = principal.key_id if principal is not None else None
    row, replayed = store_feedback(
        factory, inp, scope, api_key_id=api_key_id, flush=flush, wait_s=wait_s
    )
    if not replayed and after:
        from trainer import api

        api.after_feedback(factory, row)
    return feedback_json(row), replayed


def check_may_rate(factory: sessionmaker[Session], p: Principal) -> None:
    """403 when ``p`` is an agent key of a project whose agent keys may not rate."""
    if p.kind != "agent":
        return
    with factory() as db:
        settings = project_settings(db, p.project_id)
    if not agent_keys_rate(settings):
        raise APIError(
            403,
            f"project {p.project_id}'s agent keys may not rate (its setting "
            "agent_keys_rate is false): rate with a feedback key or an admin key",
        )
