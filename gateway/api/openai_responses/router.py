"""OpenAI Responses routes: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``; the Conversations API's routes are
``conversations.py``'s, included here.

A feedback key cannot read responses (403); what else may be read or continued is
``store.py``'s.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.base import require_model_key
from gateway.api.handler import ApiHandler, Hook, StreamWriter
from gateway.api.openai_responses import conversations, translator
from gateway.api.openai_responses.conversation_items import api_items, list_params, page_of
from gateway.api.openai_responses.store import gone, store_of, visible
from gateway.api.openai_responses.stream import ResponsesStream
from gateway.call.generation import output_json
from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest, Message
from gateway.edge.auth import require_kind
from gateway.routes.request_context import gw_of, principal
from gateway.routes.waits import locate
from schemas.tables import InteractionRow, ResponseDeletionRow

router = APIRouter()
router.routes.extend(conversations.router.routes)  # one router: its paths are the API's


class Responses(ApiHandler):
    ID_PREFIX = translator.ID_PREFIX
    turn: conversations.Turn | None = None  # set when the call names a ``conversation``

    async def to_internal(self) -> list[GenerationRequest]:
        """A ``previous_response_id`` continues a stored response (``store.py``); a
        ``conversation`` continues its items, and its turns are one session."""
        call = self.call
        if isinstance(call.body, dict) and isinstance(call.body.get("input"), list):
            call.body = {
                **call.body,
                "input": await conversations.resolve_references(
                    call.request, call.principal, call.body["input"], "input"
                ),
            }
        parsed = translator.parse(call.body)
        history: list[Message] = []
        hint = self.session_header()
        if parsed.previous_response_id:
            require_model_key(call.principal)
            history = await store_of(call.request).conversation(
                parsed.previous_response_id, call.principal, call.request
            )
        elif parsed.conversation is not None:
            require_model_key(call.principal)
            cid = conversations.conversation_id(parsed.conversation)
            history = await conversations.history(call.request, call.principal, cid)
            hint = cid
            self.turn = conversations.Turn(call.request, call.principal, cid, call.body)
        return [translator.to_internal(parsed, call.body, history, hint)]

    def session_header(self) -> str | None:
        """``X-Session-Id``, or Codex's own header (``session-id`` since 0.17x,
        ``session_id`` before)."""
        h = self.call.request.headers
        return super().session_header() or h.get("session-id") or h.get("session_id")

    def body(self, prep: Prepared, completions: list[Completion]) -> dict[str, Any]:
        return translator.response_body(prep, completions[0], self.model)

    def writer(self, prep: Prepared) -> StreamWriter:
        stream = ResponsesStream(prep, self.model)
        if self.turn is not None:
            self.turn.output = lambda: stream.items.items
        return stream

    def recorded(self, prep: Prepared) -> Hook:
        """The response is kept for ``previous_response_id`` and ``GET`` once recorded,
        and noted for its conversation's items."""
        call = self.call
        store = store_of(call.request)
        turn = self.turn

        def remember(completions: list[Completion]) -> None:
            sid = prep.session.session_id
            output = output_json(completions[0])
            store.remember(prep.interaction_id, call.principal.project_id, sid, call.body, output)
            if turn is not None:
                turn.recorded(prep.interaction_id)

        return remember

    async def answer(self, preps: list[Prepared]) -> Response:
        """The answer; with a ``conversation``, its input and output items are appended
        before the answer (or the stream's ``response.completed``) reaches the client."""
        response = await super().answer(preps)
        return response if self.turn is None else await self.turn.finish(response)


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(request: Request) -> Response:
    return await Responses.handle(request)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response, rebuilt from its record (output item ids are fresh)."""
    row = await _stored(request, response_id)
    return translator.stored_response(row, gw_of(request).settings.served_model_name)


async def _stored(request: Request, response_id: str) -> InteractionRow:
    """A stored response the caller may read (403 for a feedback key, 404 otherwise)."""
    gw = gw_of(request)
    p = await principal(request)
    require_kind(p, "agent", "admin")  # a feedback key rates ids, it does not read outputs

    def load() -> InteractionRow | None:
        with gw.factory() as db:
            if db.get(ResponseDeletionRow, response_id) is not None:
                raise gone(response_id)  # deleted: hidden, the record kept
            row = db.get(InteractionRow, response_id)
            if row is not None:
                db.expunge(row)
            return row

    # committed before its answer was sent (gateway.recording.commits); locate covers an answer
    # released without its commit (database slow or down)
    row = await locate(request, p.key_id, response_id, load)
    if (
        row is None
        or not visible(p, row.project_id, row.session_id)
        or row.request.get("store") is False
        or not response_id.startswith(translator.ID_PREFIX)
    ):
        raise gone(response_id)
    return row


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    """Hide a stored response from the API (OpenAI's delete): GET, its input items and
    ``previous_response_id`` then 404. Records are never rewritten: this writes a marker
    (``response_deletions``) and the interaction record stays, for training and audit."""
    row = await _stored(request, response_id)
    p = await principal(request)
    await asyncio.to_thread(store_of(request).delete, response_id, row.project_id, p.key_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request) -> dict[str, Any]:
    """The input items of a stored response (its own ``input``, not what
    ``previous_response_id`` or ``conversation`` added), ids derived from the response."""
    params = list_params(request)
    row = await _stored(request, response_id)
    return page_of(api_items(row.request.get("input"), "input", response_id), params)
