"""OpenAI Responses API routes: POST /v1/responses, GET /v1/responses/{id}.

Responses are stored as what every call already is: a recorded interaction (request JSON
as sent + parsed output). ``previous_response_id`` rebuilds the conversation by walking
those records back; a response this process answered is found in memory at once, one
answered by another replica is polled for briefly (recording commits asynchronously).
A response of another project, or one created with ``store: false``, is a 404.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import select

from gateway import openai_responses as oresp
from gateway.errors import APIError
from gateway.request import Completion, Message, ToolCallOut
from gateway.routing import gw_of, headers_for, principal, read_json
from gateway.service import open_stream
from schemas.tables import InteractionRow

router = APIRouter()

LOOKUP_WAIT_S = 3.0  # how long a previous_response_id may take to show up in the database
MAX_CHAIN = 10_000


class ResponseStore:
    """Recent responses of this process (id -> project, request, output) plus the database."""

    def __init__(self, factory: Any, capacity: int = 20_000) -> None:
        self.factory = factory
        self.capacity = capacity
        self.recent: OrderedDict[str, tuple[str, dict[str, Any], dict[str, Any]]] = OrderedDict()

    def remember(
        self, rid: str, project: str, request: dict[str, Any], output: dict[str, Any]
    ) -> None:
        self.recent[rid] = (project, request, output)
        while len(self.recent) > self.capacity:
            self.recent.popitem(last=False)

    def _db_get(self, rid: str) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        with self.factory() as db:
            row = db.execute(
                select(
                    InteractionRow.project_id, InteractionRow.request, InteractionRow.output
                ).where(InteractionRow.id == rid)
            ).first()
        return (row[0], row[1], row[2]) if row else None

    async def get(
        self, rid: str, project: str, deadline: float
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        hit = self.recent.get(rid)
        while hit is None and rid.startswith("resp_"):
            hit = await asyncio.to_thread(self._db_get, rid)
            if hit is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if hit is None or hit[0] != project:
            raise APIError(
                404, f"no response with id '{rid}' was found", param="previous_response_id"
            )
        _, request, output = hit
        if request.get("store") is False:
            raise APIError(
                404,
                f"response '{rid}' was created with store: false, so it cannot be continued; "
                "send the whole conversation as input instead",
                param="previous_response_id",
            )
        return request, output

    async def conversation(self, rid: str, project: str) -> list[Message]:
        """All messages up to and including the answer of response ``rid``."""
        deadline = time.monotonic() + LOOKUP_WAIT_S
        turns: list[list[Message]] = []
        seen: set[str] = set()
        current: str | None = rid
        while current and current not in seen and len(turns) < MAX_CHAIN:
            seen.add(current)
            request, output = await self.get(current, project, deadline)
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
        history = await store.conversation(parsed.previous_response_id, p.project_id)
    hint = session_header(request)
    req = oresp.to_internal(parsed, body, history, hint)
    prep = await gw.pipeline.prepare(p, req, "resp_")
    model = gw.settings.served_model_name

    def remember(c: Completion) -> None:
        store.remember(prep.interaction_id, p.project_id, body, _output_dict(c))

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

    def load() -> InteractionRow | None:
        with gw.factory() as db:
            row = db.get(InteractionRow, response_id)
            if row is not None:
                db.expunge(row)
            return row

    row = await asyncio.to_thread(load)
    if (
        row is None
        or row.project_id != p.project_id
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
