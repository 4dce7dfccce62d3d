"""OpenAI Chat Completions routes: ``POST /v1/chat/completions`` (alias ``/chat/completions``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.handler import ApiHandler, StreamWriter
from gateway.api.openai_chat import translator
from gateway.api.openai_chat.stream import ChatStream
from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest

router = APIRouter()


class ChatCompletions(ApiHandler):
    ID_PREFIX = translator.ID_PREFIX

    async def to_internal(self) -> list[GenerationRequest]:
        return [translator.to_internal(self.call.body, self.session_header())]

    def body(self, prep: Prepared, completions: list[Completion]) -> dict[str, Any]:
        return translator.response_body(prep, completions, self.tokenizer, self.model)

    def writer(self, prep: Prepared) -> StreamWriter:
        return ChatStream(prep, self.tokenizer, self.model)


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    return await ChatCompletions.handle(request)
