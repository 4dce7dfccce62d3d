"""OpenAI Completions route: ``POST /v1/completions`` (alias ``/completions``).

Each prompt of a call is its own interaction (``n`` choices each), prepared by the shared
pipeline; the prompts are generated, streamed or not, and recorded as one unit
(``prompt_batch.py``). The answer's id is the first prompt's interaction id and
``X-Rlgate-Interaction-Ids`` lists every prompt's."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core.errors import APIError
from gateway.api.handler import ApiHandler
from gateway.api.openai_completions import prompt_batch, stream, translator
from gateway.call.pipeline import Prepared
from gateway.call.request import GenerationRequest
from gateway.routes.request_context import headers_for

router = APIRouter()


class Completions(ApiHandler):
    ID_PREFIX = translator.ID_PREFIX
    OPERATION = "text_completion"

    async def to_internal(self) -> list[GenerationRequest]:
        return translator.to_internal(self.call.body, self.session_header())

    async def prepare_all(self, reqs: list[GenerationRequest]) -> list[Prepared]:
        """Every prompt prepared before any is generated; with several, a refused one (too
        long, say) is a 400 that names its index, and nothing runs."""
        preps = []
        for k, r in enumerate(reqs):
            try:
                preps.append(await self.prepare(r))
            except APIError as e:
                if len(reqs) == 1:
                    raise
                param = f"prompt[{k}]" if e.param in (None, "prompt") else e.param
                raise APIError(
                    e.status,
                    f"prompt {k} (of {len(reqs)}, counted from 0): {e.message}",
                    param=param,
                    code=e.code,
                    headers=e.headers,
                ) from None
        return preps

    async def answer(self, preps: list[Prepared]) -> Response:
        """Every prompt generated at once, streamed as one stream or answered together,
        and recorded as one unit."""
        headers = {
            **headers_for(preps[0]),
            "X-Rlgate-Interaction-Ids": ",".join(p.interaction_id for p in preps),
        }
        if preps[0].req.stream:
            opened = await prompt_batch.open_all(self.pipeline, preps)
            writer = stream.CompletionStream(preps, self.tokenizer, self.model)
            return StreamingResponse(
                stream.body(self.pipeline, opened, writer),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        results = await prompt_batch.complete(self.pipeline, preps)
        body = translator.response_body(preps, results, self.tokenizer, self.model)
        return JSONResponse(body, headers=headers)


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    return await Completions.handle(request)
