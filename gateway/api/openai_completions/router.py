"""OpenAI Completions route: ``POST /v1/completions`` (alias ``/completions``).

Each prompt of a call is its own interaction (``n`` choices each), prepared and recorded
by the shared pipeline; the answer's id is the first prompt's interaction id and
``X-Rlgate-Interaction-Ids`` lists every prompt's."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.handler import ApiHandler, StreamWriter
from gateway.api.openai_completions import translator
from gateway.api.openai_completions.stream import CompletionStream
from gateway.errors import bad_request
from gateway.pipeline import Prepared
from gateway.request import Completion, GenerationRequest
from gateway.request_context import headers_for

router = APIRouter()


class Completions(ApiHandler):
    ID_PREFIX = translator.ID_PREFIX

    async def to_internal(self) -> list[GenerationRequest]:
        reqs = translator.to_internal(self.call.body, self.session_header())
        if len(reqs) > 1 and reqs[0].stream:
            raise bad_request(
                "stream takes one prompt per call; send each prompt as its own streaming call "
                "(or several prompts without stream)",
                "prompt",
            )
        return reqs

    def body(self, prep: Prepared, completions: list[Completion]) -> dict[str, Any]:
        return translator.response_body([prep], [completions], self.tokenizer, self.model)

    def writer(self, prep: Prepared) -> StreamWriter:
        return CompletionStream(prep, self.tokenizer, self.model)

    async def answer(self, preps: list[Prepared]) -> Response:
        """One prompt as any call; several generated at once and answered together."""
        if len(preps) == 1:
            return await super().answer(preps)
        results = await asyncio.gather(*(self.pipeline.complete(p) for p in preps))
        headers = {
            **headers_for(preps[0]),
            "X-Rlgate-Interaction-Ids": ",".join(p.interaction_id for p in preps),
        }
        body = translator.response_body(preps, results, self.tokenizer, self.model)
        return JSONResponse(body, headers=headers)


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    return await Completions.handle(request)
