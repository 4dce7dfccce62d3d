"""The OpenAI Conversations API (``/v1/conversations``) and what ``responses.create``
does with a ``conversation``.

A conversation belongs to the project of the key that created it (another project's key
gets a 404; a per-session key sees only those created with its session). Agent and admin
keys use it; a feedback key gets a 403. Items are stored in the API's shape
(``conversation_store``); every write commits before its answer.

With ``conversation`` a response's prompt is the conversation's items, then its input;
once the response is recorded its input items and output items are appended (before the
answer, or before a stream's ``response.completed``). Its turns form one session: the
conversation id is the session's external id, as an ``X-Session-Id`` would be, so a
session-level rating covers every turn.

An ``item_reference`` input item (in ``responses.create``'s input or in items added to a
conversation) is replaced by the conversation item it names (``resolve_references``): the
prompt, the record's request and the conversation hold the item itself. The item routes
take ``include`` as OpenAI defines it (``conversation_items.check_include``: an unknown
value is a 400); the data it names is none rlgate's items hold, so it adds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from core.db import DB_DOWN
from core.errors import APIError
from gateway.api.openai_responses.conversation_items import (
    api_items,
    check_include,
    is_reference,
    list_params,
)
from gateway.api.openai_responses.conversation_store import (
    MAX_ADDED_ITEMS,
    MAX_INITIAL_ITEMS,
    ConversationStore,
    check_metadata,
)
from gateway.api.openai_responses.translator import parse_input
from gateway.call.request import Message
from gateway.edge.auth import Principal, require_kind
from gateway.edge.errors import bad_request
from gateway.routes.request_context import gw_of, principal, read_json

log = logging.getLogger("rlgate.conversations")
router = APIRouter()


def conversations_of(request: Request) -> ConversationStore:
    state = request.app.state
    store = getattr(state, "conversations", None)
    if store is None:
        gw = gw_of(request)
        store = ConversationStore(gw.factory, gw.pipeline.redaction)
        state.conversations = store
    return store


async def _caller(request: Request) -> Principal:
    p = await principal(request)
    require_kind(p, "agent", "admin")  # a feedback key rates ids, it does not read outputs
    return p


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    body = await read_json(request) if raw.strip() else {}  # the SDK may send no body
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


async def resolve_references(request: Request, p: Principal, raw: Any, where: str) -> Any:
    """``raw`` input with each ``item_reference`` (``{"type": "item_reference", "id"}``)
    replaced by the conversation item it names, of any conversation the caller sees; a
    404 naming the reference when there is none. The item comes as stored (the API's
    shape; an output message or call is read back as the model's turn)."""
    if not isinstance(raw, list) or not any(is_reference(i) for i in raw):
        return raw
    ids = [str(i.get("id")) for i in raw if is_reference(i)]
    found = await asyncio.to_thread(conversations_of(request).items_by_id, ids, p)
    out = []
    for k, item in enumerate(raw):
        if not is_reference(item):
            out.append(item)
            continue
        iid = item.get("id")
        if not isinstance(iid, str) or iid not in found:
            raise APIError(
                404,
                f"{where}[{k}] is an item_reference to '{iid}', and no item with that id was "
                "found in a conversation of this project",
                param=f"{where}[{k}].id",
            )
        out.append(found[iid])
    return out


def _items(body: dict[str, Any], most: int, required: bool) -> list[dict[str, Any]]:
    raw = body.get("items")
    if raw is None and not required:
        return []
    if not isinstance(raw, list) or (required and not raw):
        raise bad_request("items must be a non-empty list of items", "items")
    if len(raw) > most:
        raise bad_request(f"items has {len(raw)} items; at most {most} are allowed", "items")
    return api_items(raw, "items")


@router.post("/v1/conversations")
async def create_conversation(request: Request) -> dict[str, Any]:
    p = await _caller(request)
    body = await _body(request)
    metadata = check_metadata(body.get("metadata"))
    items = _items(body, MAX_INITIAL_ITEMS, required=False)
    return await asyncio.to_thread(conversations_of(request).create, p, metadata, items)


@router.get("/v1/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    return await asyncio.to_thread(conversations_of(request).get, conversation_id, p)


@router.post("/v1/conversations/{conversation_id}")
async def update_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    body = await _body(request)
    if "metadata" not in body:
        raise bad_request("metadata is required to update a conversation", "metadata")
    metadata = check_metadata(body["metadata"])
    store = conversations_of(request)
    return await asyncio.to_thread(store.update, conversation_id, p, metadata)


@router.delete("/v1/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    return await asyncio.to_thread(conversations_of(request).delete, conversation_id, p)


@router.post("/v1/conversations/{conversation_id}/items")
async def add_items(conversation_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    check_include(request)
    body = await _body(request)
    if isinstance(body.get("items"), list):
        body["items"] = await resolve_references(request, p, body["items"], "items")
    items = _items(body, MAX_ADDED_ITEMS, required=True)
    store = conversations_of(request)
    items = await asyncio.to_thread(store.add_items, conversation_id, p, items)
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"],
        "last_id": items[-1]["id"],
        "has_more": False,
    }


@router.get("/v1/conversations/{conversation_id}/items")
async def list_items(conversation_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    check_include(request)
    params = list_params(request)
    return await asyncio.to_thread(conversations_of(request).items, conversation_id, p, params)


@router.get("/v1/conversations/{conversation_id}/items/{item_id}")
async def get_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    check_include(request)
    store = conversations_of(request)
    return await asyncio.to_thread(store.item, conversation_id, item_id, p)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
async def delete_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    p = await _caller(request)
    store = conversations_of(request)
    return await asyncio.to_thread(store.delete_item, conversation_id, item_id, p)


# ---- responses.create with a conversation ---------------------------------------------


def conversation_id(raw: Any) -> str:
    """The id of ``conversation`` as sent: a string, or ``{"id": ...}``."""
    cid = raw.get("id") if isinstance(raw, dict) else raw
    if not isinstance(cid, str) or not cid:
        raise bad_request(
            "conversation must be a conversation id or an object {'id': ...}", "conversation"
        )
    return cid


async def history(
    request: Request, p: Principal, cid: str, before: str | None = None
) -> list[Message]:
    """The conversation's items as the messages before this turn's input (404 naming
    ``conversation`` when it is not the caller's); with ``before``, those before that
    response's own items."""
    items = await asyncio.to_thread(conversations_of(request).history, cid, p, before)
    return parse_input(items, "conversation")


class Turn:
    """Appends a response's input and output items to its conversation once the response
    is recorded (``recorded`` is the pipeline's hook), before the client is answered."""

    def __init__(self, request: Request, p: Principal, cid: str, body: dict[str, Any]) -> None:
        self.request, self.p, self.cid, self.body = request, p, cid, body
        self.response_id: str | None = None
        # the answer's output items (those of the stream's writer, or of the JSON body)
        self.output: Callable[[], list[dict[str, Any]]] | None = None

    def recorded(self, response_id: str) -> None:
        self.response_id = response_id

    async def append(self) -> None:
        if self.response_id is None or self.output is None:
            return
        rid, output = self.response_id, self.output()
        self.response_id = None  # once
        items = api_items(self.body.get("input"), "input", rid) + [dict(i) for i in output]
        store = conversations_of(self.request)
        try:
            await asyncio.to_thread(store.add_items, self.cid, self.p, items, rid)
        except DB_DOWN as e:  # the response is recorded (spool); its items are not kept
            log.warning("response %s not appended to %s: database down (%s)", rid, self.cid, e)
        except APIError as e:  # the conversation was deleted while the response ran
            log.info("response %s not appended to %s: %s", rid, self.cid, e.message)

    async def _then(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async with contextlib.aclosing(chunks) as it:  # type: ignore[type-var]
            async for chunk in it:
                await self.append()  # a no-op until the stream's record is made
                yield chunk

    async def finish(self, response: Response) -> Response:
        """Appends now (a JSON answer), or before a stream's end event is sent."""
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._then(response.body_iterator)
            return response
        self.output = lambda: json.loads(bytes(response.body)).get("output") or []
        await self.append()
        return response
