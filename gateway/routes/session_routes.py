"""Session routes: ``POST /v1/sessions`` (a session and a per-session key bound to it) and
``POST /v1/sessions/{id}/end``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from core.errors import APIError
from core.keys import create_key
from gateway.call.sessions import open_session, session_closed
from gateway.edge.auth import BOOTSTRAP_ADMIN_ID, require_kind
from gateway.edge.errors import bad_request
from gateway.edge.storable import bounded_str
from gateway.routes.request_context import gw_of, principal, read_json
from schemas.atdp import SessionStatus
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import SessionRow

router = APIRouter()


@router.post("/v1/sessions")
async def create_session(request: Request) -> JSONResponse:
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "agent", "admin")
    if p.session_id is not None:  # its key would outlive the session it came from
        raise APIError(
            403,
            "a per-session key cannot open sessions: use the project's agent key (or an "
            "admin key) for POST /v1/sessions",
        )
    raw = await request.body()
    body = await read_json(request) if raw.strip() else {}
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    meta = body.get("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object", "metadata")
    fields = {k: bounded_str(body, k) for k in ("task_id", "agent_name", "external_id")}

    def create() -> tuple[str, str]:
        with gw.factory() as db, db.begin():
            row = to_row(open_session(p.project_id, metadata=meta, **fields))
            db.add(row)
            db.flush()
            key, secret = create_key(
                db,
                p.project_id,
                "agent",
                name=f"session {row.id}",
                session_id=row.id,
                parent_key_id=None if p.key_id == BOOTSTRAP_ADMIN_ID else p.key_id,
                actor=p.key_id,
            )
            row.api_key_id = key.id
            return row.id, secret

    sid, secret = await asyncio.to_thread(create)
    return JSONResponse(
        {
            "id": sid,
            "object": "session",
            "api_key": secret,
            "project_id": p.project_id,
            "status": SessionStatus.open.value,
        },
        status_code=201,
    )


@router.post("/v1/sessions/{session_id}/end")
async def end_session(session_id: str, request: Request) -> dict[str, Any]:
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "agent", "admin")

    def end() -> tuple[dict[str, Any], bool]:
        with gw.factory() as db, db.begin():
            row = db.get(SessionRow, session_id)
            if (
                row is None
                or row.project_id != p.project_id
                or (p.session_id and p.session_id != session_id)
            ):
                raise APIError(404, f"no session {session_id}")
            closed_now = row.status == SessionStatus.open
            if closed_now:
                row.status = SessionStatus.closed.value
                row.closed_at = utcnow()
            return {"id": row.id, "object": "session", "status": row.status}, closed_now

    out, closed_now = await asyncio.to_thread(end)
    if closed_now:  # settle credit assignment, run the project's verifiers
        await asyncio.to_thread(session_closed, gw.factory, session_id)
    return out
