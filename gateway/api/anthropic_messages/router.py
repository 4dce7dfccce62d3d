"""Anthropic Messages routes: ``POST /v1/messages``, ``POST /v1/messages/count_tokens``.

Auth is ``x-api-key`` or ``Authorization: Bearer``; ``anthropic-version`` and
``anthropic-beta`` headers are accepted (and not required); ``?beta=true`` is ignored.
Errors under /v1/messages come out in Anthropic's ``{"type": "error", ...}`` shape
(gateway.errors.error_style).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.anthropic_messages import translator
from gateway.api.anthropic_messages.stream import MessagesStream
from gateway.api.base import open_call, require_model_key, respond
from gateway.request_context import gw_of, principal, read_json

router = APIRouter()


@router.post("/v1/messages")
@router.post("/messages", include_in_schema=False)
async def messages(request: Request) -> Response:
    call = await open_call(request)
    req = translator.to_internal(call.body, request.headers.get("x-session-id"))
    prep = await call.prepare(req, translator.ID_PREFIX, fit_max_tokens=True)
    tok, ctx = call.gw.tokenizer, call.gw.pipeline.renderer.context_length
    return await respond(
        call,
        prep,
        lambda completions: translator.message_body(prep, completions[0], tok, call.model, ctx),
        lambda: MessagesStream(prep, tok, call.model, ctx),
    )


@router.post("/v1/messages/count_tokens")
@router.post("/messages/count_tokens", include_in_schema=False)
async def count_tokens(request: Request) -> dict[str, Any]:
    """The prompt's ids are rendered as for a call (character limit first, then the render
    pool), so counting is bounded the same way."""
    gw = gw_of(request)
    require_model_key(await principal(request))
    req = translator.to_internal(await read_json(request), None, count_only=True)
    return {"input_tokens": len(await gw.pipeline.prompt_ids(req))}
