"""OpenAI Responses API routes: POST /v1/responses, GET /v1/responses/{id}.

Responses are stored as what every call already is: a recorded interaction (request JSON
as sent + parsed output). ``previous_response_id`` rebuilds the conversation by walking
those records back; a response this process answered is found in memory at once, one
answered by another replica is looked up again briefly (gateway.waits.locate: on the event
loop, never holding a worker thread). A response of another project, of another session
(for a per-session key), or one created with ``store: false``, is a 404; a feedback key
cannot read responses (403).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import select

from core.errors import APIError
from gateway import openai_responses as oresp
from gateway.auth import Principal, require_kind
from gateway.request import Completion, Message, ToolCallOut
from gateway.routing import gw_of, headers_for, principal, read_json
from gateway.service import open_stream
from gateway.waits import locate
from schemas.tables import InteractionRow

router = APIRouter()

MAX_CHAIN = 10_000

# project, session, request JSON, output
Stored = tuple[str, str, dict[str, Any], dict[str, Any]]


def visible(p: Principal, project: str, session: str) -> bool:
    """Whether a caller may read or continue a response: its project and, for a
    per-session key, its session."""
    return project == p.project_id and (p.session_id is None or session == p.session_id)


class ResponseStore:
    """Recent responses of this process (id -> project, session, request, output) plus
    the database."""

    def __init__(self, factory: Any, capacity: int = 20_000, max_bytes: int = 64 << 20) -> None:
        self.factory = factory
        self.capacity = capacity
        self.max_bytes = max_bytes  # JSON size of the kept requests + outputs
        self.bytes = 0
        self.recent: OrderedDict[str, Stored] = OrderedDict()
        self._sizes: dict[str, int] = {}

    def remember(
        self, rid: str, project: str, session: str, request: dict[str, Any], output: dict[str, Any]
    ) -> None:
        """Keep a response; the oldest go once over ``capacity`` entries or ``max_bytes``
        (older ones are then read from the database)."""
        size = len(json.dumps(request, default=str)) + len(json.dumps(output, default=str))
        self.bytes += size - self._sizes.get(rid, 0)
        self._sizes[rid] = size
        self.recent[rid] = (project, session, request, output)
        self.recent.move_to_end(rid)
        while self.recent and (len(self.recent) > self.capacity or self.bytes > self.max_bytes):
            old, _ = self.recent.popitem(last=False)
            self.bytes -= self._sizes.pop(old, 0)

    def _db_get(self, rid: str) -> Stored | None:
        with self.factory() as db:
            row = db.execute(
                select(
                    InteractionRow.project_id,
                    InteractionRow.session_id,
                    InteractionRow.request,
                    InteractionRow.output,
                ).where(InteractionRow.id == rid)
            ).first()
        return (row[0], row[1], row[2], row[3]) if row else None

    async def get(
        self, rid: str, p: Principal, http: Request
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        hit = self.recent.get(rid)
        if hit is None and rid.startswith("resp_"):
            hit = await locate(http, p.key_id, rid, lambda: self._db_get(rid))
        if hit is None or not visible(p, hit[0], hit[1]):
            raise APIError(
                404, f"no response with id '{rid}' was found", param="previous_response_id"
            )
        _, _, request, output = hit
        if request.get("store") is False:
            raise APIError(
                404,
                f"response '{rid}' was created with store: false, so it cannot be continued; "
                "send the whole conversation as input instead",
                param="previous_response_id",
            )
        return request, output

    async def conversation(self, rid: str, p: Principal, http: Request) -> list[Message]:
        """All messages up to and including the answer of response ``rid``."""
        turns: list[list[Message]] = []
        seen: set[str] = set()
        current: str | None = rid
        while current and current not in seen and len(turns) < MAX_CHAIN:
            seen.add(current)
            request, output = await self.get(current, p, http)
            turns.append(oresp.history_turn(request, output))
            prev = request.get("previous_response_id")
            current = prev if isinstance(prev, str) else None
        return [m for turn in reversed(turns) for m in turn]


def store_of(request: Request) -> ResponseStore:
    state = request.app.state
    store = getattr(state, "responses_store", None)
    if store is None:
        store = ResponseStore(gw_of(request).factory)
        state.responses_store = store
    return store


def _output_dict(c: Completion) -> dict[str, Any]:
    """The same shape Pipeline.record writes into ``interactions.output``."""
    return {
        "text": c.content,
        "reasoning": c.reasoning,
        "tool_calls": [
            {"id": t.id, "name": t.name, "arguments": t.arguments} for t in c.tool_calls
        ],
    }


def session_header(request: Request) -> str | None:
    """The client's session id: ``X-Session-Id``, or Codex's own header (``session-id``
    since 0.17x, ``session_id`` before)."""
    h = request.headers
    return h.get("x-session-id") or h.get("session-id") or h.get("session_id")


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(request: Request) -> Response:
    gw = gw_of(request)
    p = await principal(request)
    body = await read_json(request)
    parsed = oresp.parse(body)
    store = store_of(request)
    history: list[Message] = []
    if parsed.previous_response_id:
        if p.kind not in ("agent", "admin"):
            raise APIError(403, f"a {p.kind} key cannot call models; use an agent key")
        history = await store.conversation(parsed.previous_response_id, p, request)
    hint = session_header(request)
    req = oresp.to_internal(parsed, body, history, hint)
    prep = await gw.pipeline.prepare(p, req, "resp_")
    model = gw.settings.served_model_name

    def remember(c: Completion) -> None:
        store.remember(
            prep.interaction_id, p.project_id, prep.session.session_id, body, _output_dict(c)
        )

    if req.stream:
        events, first = await open_stream(gw.pipeline, prep)
        return StreamingResponse(
            oresp.stream_body(gw.pipeline, prep, events, first, model, remember),
            media_type="text/event-stream",
            headers={**headers_for(prep), "Cache-Control": "no-cache"},
        )
    (completion,) = await gw.pipeline.run(prep)
    await gw.pipeline.record(prep, [completion])
    remember(completion)
    return JSONResponse(oresp.response_body(prep, completion, model), headers=headers_for(prep))


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response, rebuilt from its record (output item ids are fresh)."""
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "agent", "admin")  # a feedback key rates ids, it does not read outputs

    def load() -> InteractionRow | None:
        with gw.factory() as db:
            row = db.get(InteractionRow, response_id)
            if row is not None:
                db.expunge(row)
            return row

    row = await asyncio.to_thread(load)
    if (
        row is None
        or not visible(p, row.project_id, row.session_id)
        or row.request.get("store") is False
        or not response_id.startswith("resp_")
    ):
        raise APIError(404, f"no response with id '{response_id}' was found")
    out = row.output or {}
    completion = Completion(
        0,
        row.completion_token_ids,
        row.completion_logprobs,
        None,
        out.get("text") or "",
        out.get("text"),
        out.get("reasoning"),
        [ToolCallOut(t["id"], t["name"], t["arguments"]) for t in out.get("tool_calls") or []],
        row.finish_reason,
        len(row.prompt_token_ids),
    )
    return oresp.stored_object(
        response_id,
        row.request,
        (row.temperature, row.top_p),
        len(row.prompt_token_ids),
        gw.settings.served_model_name,
        "completed",
        oresp.output_items(completion, oresp.namespaces(row.request.get("tools"))),
        completion,
        int(row.created_at.timestamp()),
    )
