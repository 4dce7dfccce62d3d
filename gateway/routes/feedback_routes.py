"""Feedback routes: ``POST /feedback``, ``GET /v1/feedback``, ``GET /v1/sessions/{id}``."""

from __future__ import annotations

import asyncio
import base64
import binascii
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import and_, or_, select

from core.errors import APIError
from core.feedback import feedback_json, find_interaction
from gateway.edge.auth import require_kind
from gateway.edge.errors import bad_request
from gateway.routes.feedback import check_may_rate, parse_feedback, scope_of, submit_feedback
from gateway.routes.request_context import gw_of, principal, read_json
from gateway.routes.waits import locate, until_committed
from schemas.convert import to_record
from schemas.tables import FeedbackRow, InteractionRow, SessionRow

router = APIRouter()

MAX_LIMIT = 500


@router.post("/feedback")
@router.post("/v1/feedback", include_in_schema=False)
async def post_feedback(request: Request) -> JSONResponse:
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "agent", "feedback", "admin")
    inp = parse_feedback(await read_json(request))
    if p.kind == "agent":
        await asyncio.to_thread(check_may_rate, gw.factory, p)
    if inp.target == "interaction" and inp.ref is not None:
        # wait for the recorder on the event loop, not in a worker thread; an id that is
        # neither stored nor being recorded gets its 404 from submit_feedback at once
        scope = scope_of(p)
        ref = inp.ref
        await locate(request, p.key_id, ref, lambda: find_interaction(gw.factory, scope, ref))
    elif inp.target == "session" and inp.ref is not None:
        sid = inp.ref
        await locate(request, p.key_id, sid, lambda: _session_exists(gw.factory, sid))
    elif inp.target == "latest":
        await until_committed(gw.recorder, p.session_id)
    fb, replayed = await asyncio.to_thread(submit_feedback, gw.factory, inp, principal=p, wait_s=0)
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return JSONResponse(fb, headers=headers)


def _session_exists(factory: Any, session_id: str) -> bool | None:
    with factory() as db:
        return True if db.get(SessionRow, session_id) is not None else None


def _cursor_encode(row: FeedbackRow) -> str:
    raw = f"{row.created_at.isoformat()}|{row.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor_decode(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, fid = raw.split("|", 1)
        return datetime.fromisoformat(at), fid
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad_request("'cursor' is not a cursor this API returned", "cursor") from None


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise bad_request(f"'{name}' must be an integer", name) from None
    if not lo <= v <= hi:
        raise bad_request(f"'{name}' must be between {lo} and {hi}", name)
    return v


@router.get("/v1/feedback")
async def list_feedback(request: Request) -> dict[str, Any]:
    """Admin: feedback oldest first, filtered by project, session_id, interaction_id,
    source, since (ISO time); paged by limit + offset or by cursor (``next_cursor``)."""
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "admin")
    scope = scope_of(p)
    q = request.query_params
    limit = _int_param(request, "limit", 100, 1, MAX_LIMIT)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    project = q.get("project") or q.get("project_id")
    if scope.project_id is not None:
        if project is not None and project != scope.project_id:
            raise APIError(403, "this admin key sees its own project only", param="project")
        project = scope.project_id
    since = None
    if q.get("since"):
        try:
            since = datetime.fromisoformat(q["since"].replace("Z", "+00:00"))
        except ValueError:
            raise bad_request("'since' must be an ISO 8601 time", "since") from None
        if since.tzinfo is None:
            raise bad_request("'since' needs a time zone, e.g. 2025-01-01T00:00:00Z", "since")
    cursor = _cursor_decode(q["cursor"]) if q.get("cursor") else None
    if cursor is not None and offset:
        raise bad_request("send either 'cursor' or 'offset', not both", "cursor")

    def run() -> dict[str, Any]:
        stmt = select(FeedbackRow)
        if project is not None:
            stmt = stmt.where(FeedbackRow.project_id == project)
        if q.get("session_id"):
            stmt = stmt.where(FeedbackRow.session_id == q["session_id"])
        if q.get("interaction_id"):
            stmt = stmt.where(FeedbackRow.target_id == q["interaction_id"])
        if q.get("source"):
            stmt = stmt.where(FeedbackRow.source == q["source"])
        if since is not None:
            stmt = stmt.where(FeedbackRow.created_at >= since)
        if cursor is not None:
            at, fid = cursor
            stmt = stmt.where(
                or_(
                    FeedbackRow.created_at > at,
                    and_(FeedbackRow.created_at == at, FeedbackRow.id > fid),
                )
            )
        stmt = stmt.order_by(FeedbackRow.created_at, FeedbackRow.id)
        with gw.factory() as db:
            rows = db.scalars(stmt.offset(offset).limit(limit + 1)).all()
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "object": "list",
            "data": [feedback_json(r) for r in rows],
            "has_more": more,
            "next_cursor": _cursor_encode(rows[-1]) if more and rows else None,
        }

    return await asyncio.to_thread(run)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> dict[str, Any]:
    """A session with its interactions (ids, rewards) and its feedback."""
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "agent", "admin")
    scope = scope_of(p)
    await until_committed(gw.recorder, session_id)

    def run() -> dict[str, Any]:
        with gw.factory() as db:
            row = db.get(SessionRow, session_id)
            if row is None or not scope.sees(row.project_id, row.id):
                raise APIError(404, f"no session {session_id}")
            out = to_record(row).model_dump(mode="json")
            its = db.execute(
                select(
                    InteractionRow.id,
                    InteractionRow.seq,
                    InteractionRow.group_id,
                    InteractionRow.choice_index,
                    InteractionRow.parent_id,
                    InteractionRow.policy_version,
                    InteractionRow.finish_reason,
                    InteractionRow.reward,
                    InteractionRow.consumed_by_run_id,
                    InteractionRow.created_at,
                )
                .where(InteractionRow.session_id == session_id)
                .order_by(InteractionRow.seq)
            ).all()
            fb = db.scalars(
                select(FeedbackRow)
                .where(FeedbackRow.session_id == session_id)
                .order_by(FeedbackRow.created_at, FeedbackRow.id)
            ).all()
            out["object"] = "session"
            out["interactions"] = [
                {**r._asdict(), "created_at": r.created_at.isoformat()} for r in its
            ]
            out["feedback"] = [feedback_json(f) for f in fb]
            return out

    return await asyncio.to_thread(run)
