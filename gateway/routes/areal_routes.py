"""AReaL online-mode compatibility: ``/rl/start_session``, ``/rl/set_reward``,
``/rl/end_session`` with AReaL's request and response shapes.

AReaL's online proxy (``areal.experimental.openai.proxy``):
- ``POST /rl/start_session`` (admin key) ``{"task_id": str, "api_key": str | null}`` ->
  ``{"session_id": str, "api_key": str}``. The api_key is a per-session key: chat calls
  (``/chat/completions``, ``/v1/chat/completions``, ...) made with it land in the session.
  Passing the ``api_key`` of an earlier session refreshes: that session is ended and the
  same key now names a new session. A key the gateway does not know is registered as the
  new session's key (AReaL's gateway lets the caller choose its key); a chosen key must
  be at least 32 characters. Session keys record the key that started them: revoking that
  key revokes them.
- ``POST /rl/set_reward`` (session key) ``{"reward": float, "interaction_id": str | null}``
  -> ``{"message": "success"}``. With an interaction id: the same record as a native
  interaction feedback; without: a session feedback (rewards the last turn and flows back
  with the project's gamma, like AReaL's turn discount). Both are stored as
  ``scale="scalar"`` over the project's ``settings["areal_reward_range"]`` (default
  [-1, 1]), ``source="system"``, ``rater="areal"``.
- ``POST /rl/end_session`` (session key) ``{}`` ->
  ``{"message": "success", "interaction_count": n}``; 410 when already ended.

Status codes follow AReaL's (400 for an unknown interaction or an empty session, 410 for an
ended session); error bodies are OpenAI error JSON like the rest of the gateway.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import func, select

from core.errors import APIError
from core.feedback import (
    FeedbackInput,
    Scope,
    close_session,
    find_interaction,
    project_settings,
)
from core.feedback_rules import agent_keys_rate
from core.keys import (
    MIN_CHOSEN_LEN,
    audit,
    create_key,
    display_prefix,
    find_key,
    hash_secret,
    new_id,
)
from gateway.call.sessions import open_session, session_closed
from gateway.edge.auth import BOOTSTRAP_ADMIN_ID, Principal, require_kind
from gateway.edge.errors import bad_request
from gateway.edge.storable import bounded_str
from gateway.routes.feedback import normalize, submit_feedback
from gateway.routes.request_context import gw_of, principal, read_json
from gateway.routes.waits import locate, until_committed
from schemas.atdp import ClientProtocol
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import ApiKeyRow, InteractionRow, SessionRow

router = APIRouter()

AREAL_RATER = "areal"


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    body = await read_json(request) if raw.strip() else {}
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


@router.post("/rl/start_session")
@router.post("/v1/rl/start_session", include_in_schema=False)
async def start_session(request: Request) -> dict[str, Any]:
    gw = gw_of(request)
    p = await principal(request)
    refused = "start_session needs the admin key (or a project agent key)"
    require_kind(p, "admin", "agent", message=refused)
    if p.session_id is not None:  # a session key does not start sessions
        raise APIError(403, refused)
    body = await _body(request)
    task_id = bounded_str(body, "task_id")  # sessions.task_id is String(200)
    wanted = body.get("api_key")
    if wanted is not None and (
        not isinstance(wanted, str)
        or not MIN_CHOSEN_LEN <= len(wanted) <= 200
        or any(c.isspace() for c in wanted)
    ):
        raise bad_request(
            f"'api_key' must be a string of {MIN_CHOSEN_LEN} to 200 characters without "
            "spaces (e.g. 'sk-' + 32 random hex digits), or null for a generated key",
            "api_key",
        )
    meta = body.get("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("'metadata' must be an object", "metadata")
    admin_secret = gw.auth.admin_key
    parent = None if p.key_id == BOOTSTRAP_ADMIN_ID else p.key_id

    def start() -> tuple[str, str, str | None]:
        ended: str | None = None
        with gw.factory() as db, db.begin():
            now = utcnow()
            key: ApiKeyRow | None = None
            if wanted is not None:
                if admin_secret and wanted == admin_secret:
                    raise bad_request("the admin key cannot be a session key", "api_key")
                key = find_key(db, wanted)  # an ended session's key may be refreshed
                if key is not None and key.revoked_at is not None:
                    raise APIError(409, "this api_key was revoked", param="api_key")
                if key is not None and (
                    key.kind != "agent" or key.session_id is None or key.project_id != p.project_id
                ):
                    raise APIError(
                        409, "this api_key is not a session key of this project", param="api_key"
                    )
            session = to_row(
                open_session(
                    p.project_id,
                    client_protocol=ClientProtocol.areal,
                    agent_name="areal",
                    task_id=task_id,
                    metadata=meta,
                )
            )
            sid = session.id
            db.add(session)
            db.flush()
            if key is not None:  # refresh: end the key's session, rebind the key
                old = key.session_id
                if old is not None and close_session(db, old):
                    ended = old
                key.session_id = sid
                audit(db, p.key_id, "key.rebind", p.project_id, "api_key", key.id, {"session": sid})
                secret = wanted
            elif wanted is not None:  # a key chosen by the caller
                key = ApiKeyRow(
                    id=new_id("key"),
                    project_id=p.project_id,
                    kind="agent",
                    key_hash=hash_secret(wanted),
                    prefix=display_prefix(wanted),
                    name=f"areal session {sid}",
                    session_id=sid,
                    parent_key_id=parent,
                    created_at=now,
                )
                db.add(key)
                audit(
                    db, p.key_id, "key.create", p.project_id, "api_key", key.id, {"kind": "agent"}
                )
                secret = wanted
            else:
                key, secret = create_key(
                    db,
                    p.project_id,
                    "agent",
                    name=f"areal session {sid}",
                    session_id=sid,
                    parent_key_id=parent,
                    actor=p.key_id,
                )
            db.flush()
            session.api_key_id = key.id
            return sid, secret, ended

    sid, secret, ended = await asyncio.to_thread(start)
    gw.auth.forget()  # a refreshed key names its new session at once (this replica)
    if ended is not None:
        await asyncio.to_thread(session_closed, gw.factory, ended)
    return {"session_id": sid, "api_key": secret}


def reward_range(settings: dict[str, Any]) -> tuple[float, float]:
    raw = settings.get("areal_reward_range", [-1, 1])
    ok = (
        isinstance(raw, list | tuple)
        and len(raw) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw)
        and raw[0] < raw[1]
    )
    if not ok:
        raise APIError(500, "project setting areal_reward_range must be [min, max] with min < max")
    return float(raw[0]), float(raw[1])


def _session_of(p: Principal, body: dict[str, Any]) -> str:
    if p.session_id is not None:
        return p.session_id
    if p.kind == "admin" and isinstance(body.get("session_id"), str):
        return body["session_id"]
    raise APIError(
        401, "use the session api_key from /rl/start_session (or the admin key and session_id)"
    )


def _check_session(gw: Any, p: Principal, sid: str) -> SessionRow:
    with gw.factory() as db:
        row = db.get(SessionRow, sid)
        if row is None or row.project_id != p.project_id:
            raise APIError(404, f"no session {sid}")
        return row


@router.post("/rl/set_reward")
@router.post("/v1/rl/set_reward", include_in_schema=False)
async def set_reward(request: Request) -> dict[str, Any]:
    gw = gw_of(request)
    p = await principal(request)
    body = await _body(request)
    sid = _session_of(p, body)
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not _finite(reward):
        raise bad_request("'reward' must be a finite number", "reward")
    interaction_id = body.get("interaction_id")
    if interaction_id is not None and not isinstance(interaction_id, str):
        raise bad_request("'interaction_id' must be a string or null", "interaction_id")

    srow = await asyncio.to_thread(_check_session, gw, p, sid)
    with_settings = await asyncio.to_thread(_project_settings, gw, srow.project_id)
    if p.kind == "agent" and not agent_keys_rate(with_settings):
        raise APIError(
            403,
            f"project {srow.project_id}'s agent keys may not rate (agent_keys_rate is "
            "false): set the reward with the admin key and session_id",
        )
    lo, hi = reward_range(with_settings)
    value, norm, smin, smax = normalize(reward, "scalar", lo, hi)
    scope = Scope(p.project_id, sid, p.key_id)
    # wait for the recorder on the event loop (gateway.routes.waits), never in a worker thread
    if interaction_id is None:
        n = await locate(request, p.key_id, sid, lambda: _count(gw, sid) or None)
        if not n:
            raise bad_request("No interactions in session", "interaction_id")
    elif (
        await locate(
            request,
            p.key_id,
            interaction_id,
            lambda: find_interaction(gw.factory, scope, interaction_id),
        )
        is None
    ):  # AReaL answers an unknown interaction with 400
        raise bad_request(f"Interaction {interaction_id} not found", "interaction_id")
    inp = FeedbackInput(
        target="interaction" if interaction_id else "session",
        ref=interaction_id or sid,
        value=value,
        scale="scalar",
        scale_min=smin,
        scale_max=smax,
        reward=norm,
        source="system",
        rater=AREAL_RATER,
    )

    def run() -> dict[str, Any]:
        try:
            fb, _ = submit_feedback(
                gw.factory,
                inp,
                principal=p if p.session_id else None,
                scope=scope,
                wait_s=0,
            )
        except APIError as e:
            if e.status == 404:  # AReaL answers an unknown interaction with 400
                raise bad_request(f"Interaction {interaction_id} not found") from None
            raise
        return {"message": "success", "feedback": fb}

    return await asyncio.to_thread(run)


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _project_settings(gw: Any, project_id: str) -> dict[str, Any]:
    with gw.factory() as db:
        return project_settings(db, project_id)


def _count(gw: Any, sid: str) -> int:
    with gw.factory() as db:
        return int(db.scalar(select(func.count()).where(InteractionRow.session_id == sid)) or 0)


@router.post("/rl/end_session")
@router.post("/v1/rl/end_session", include_in_schema=False)
async def end_session(request: Request) -> dict[str, Any]:
    gw = gw_of(request)
    p = await principal(request)
    body = await _body(request)
    sid = _session_of(p, body)
    await until_committed(gw.recorder, sid)

    def end() -> int:
        _check_session(gw, p, sid)
        with gw.factory() as db, db.begin():
            if not close_session(db, sid):
                raise APIError(410, f"Session {sid} already ended or expired")
            return int(db.scalar(select(func.count()).where(InteractionRow.session_id == sid)) or 0)

    n = await asyncio.to_thread(end)
    await asyncio.to_thread(session_closed, gw.factory, sid)
    return {"message": "success", "interaction_count": n}
