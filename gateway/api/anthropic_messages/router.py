"""Anthropic Messages routes: ``POST /v1/messages``, ``POST /v1/messages/count_tokens``.

Auth is ``x-api-key`` or ``Authorization: Bearer``; ``anthropic-version`` and
``anthropic-beta`` headers are accepted (and not required); ``?beta=true`` is ignored.
Errors under /v1/messages come out in Anthropic's ``{"type": "error", ...}`` shape (the
format ``spec.py`` registers). ``max_tokens`` is an upper bound (``FIT_MAX_TOKENS``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.anthropic_messages import translator
from gateway.api.anthropic_messages.stream import MessagesStream
from gateway.api.base import require_model_key
from gateway.api.handler import ApiHandler, StreamWriter
from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest
from gateway.routes.request_context import gw_of, principal, read_json

router = APIRouter()


class Messages(ApiHandler):
    ID_PREFIX = translator.ID_PREFIX
    FIT_MAX_TOKENS = True  # Claude Code asks for 32000 whatever the model's context

    async def to_internal(self) -> list[GenerationRequest]:
        return [translator.to_internal(self.call.body, self.session_header())]

    def body(self, prep: Prepared, completions: list[Completion]) -> dict[str, Any]:
        return translator.message_body(prep, completions[0], self.tokenizer, self.model)

    def writer(self, prep: Prepared) -> StreamWriter:
        return MessagesStream(prep, self.tokenizer, self.model)


@router.post("/v1/messages")
@router.post("/messages", include_in_schema=False)
async def messages(request: Request) -> Response:
    return await Messages.handle(request)


@router.post("/v1/messages/count_tokens")
@router.post("/messages/count_tokens", include_in_schema=False)
async def count_tokens(request: Request) -> dict[str, Any]:
    """The prompt's ids are rendered as for a call (character limit first, then the render
    pool), so counting is bounded the same way."""
    gw = gw_of(request)
    require_model_key(await principal(request))
    req = translator.to_internal(await read_json(request), None, count_only=True)
    return {"input_tokens": len(await gw.pipeline.prompt_ids(req))}
