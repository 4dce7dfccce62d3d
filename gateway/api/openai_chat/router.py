"""OpenAI Chat Completions routes: ``POST /v1/chat/completions`` (alias ``/chat/completions``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.base import open_call, respond
from gateway.api.openai_chat import translator
from gateway.api.openai_chat.stream import ChatStream

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    call = await open_call(request)
    req = translator.to_internal(call.body, request.headers.get("x-session-id"))
    prep = await call.prepare(req, translator.ID_PREFIX)
    tok = call.gw.tokenizer
    return await respond(
        call,
        prep,
        lambda completions: translator.response_body(prep, completions, tok, call.model),
        lambda: ChatStream(prep, tok, call.model),
    )
