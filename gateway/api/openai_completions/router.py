"""OpenAI Completions route: ``POST /v1/completions`` (alias ``/completions``).

Each prompt of a call is its own interaction (``n`` choices each), prepared and recorded
by the shared pipeline; the answer's id is the first prompt's interaction id and
``X-Rlgate-Interaction-Ids`` lists every prompt's."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.base import open_call, respond
from gateway.api.openai_completions import translator
from gateway.api.openai_completions.stream import CompletionStream
from gateway.errors import bad_request
from gateway.request_context import headers_for

router = APIRouter()


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    call = await open_call(request)
    reqs = translator.to_internal(call.body, request.headers.get("x-session-id"))
    if len(reqs) > 1 and reqs[0].stream:
        raise bad_request(
            "stream takes one prompt per call; send each prompt as its own streaming call "
            "(or several prompts without stream)",
            "prompt",
        )
    preps = [await call.prepare(r, translator.ID_PREFIX) for r in reqs]
    tok = call.gw.tokenizer
    if len(preps) == 1:
        prep = preps[0]
        return await respond(
            call,
            prep,
            lambda cs: translator.response_body([prep], [cs], tok, call.model),
            lambda: CompletionStream(prep, tok, call.model),
        )
    pipeline = call.gw.pipeline
    results = await asyncio.gather(*(pipeline.complete(p) for p in preps))
    headers = {
        **headers_for(preps[0]),
        "X-Rlgate-Interaction-Ids": ",".join(p.interaction_id for p in preps),
    }
    return JSONResponse(translator.response_body(preps, results, tok, call.model), headers=headers)
