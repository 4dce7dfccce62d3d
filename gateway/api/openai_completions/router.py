"""OpenAI Completions route: ``POST /v1/completions`` (alias ``/completions``).

Each prompt of a call is its own interaction (``n`` choices each), prepared by the shared
pipeline; the prompts are generated, streamed or not, and recorded as one unit
(gateway.prompt_batch). The answer's id is the first prompt's interaction id and
``X-Rlgate-Interaction-Ids`` lists every prompt's."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core.errors import APIError
from gateway import prompt_batch
from gateway.api.base import Call, open_call
from gateway.api.openai_completions import stream, translator
from gateway.request import GenerationRequest
from gateway.routing import headers_for
from gateway.service import Prepared

router = APIRouter()


async def _prepare(call: Call, reqs: list[GenerationRequest]) -> list[Prepared]:
    """Every prompt prepared before any is generated; with several, a refused one (too
    long, say) is a 400 that names its index, and nothing runs."""
    preps = []
    for k, r in enumerate(reqs):
        try:
            preps.append(await call.prepare(r, translator.ID_PREFIX))
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


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    call = await open_call(request)
    reqs = translator.to_internal(call.body, request.headers.get("x-session-id"))
    preps = await _prepare(call, reqs)
    headers = {
        **headers_for(preps[0]),
        "X-Rlgate-Interaction-Ids": ",".join(p.interaction_id for p in preps),
    }
    pipeline, tok = call.gw.pipeline, call.gw.tokenizer
    if reqs[0].stream:
        opened = await prompt_batch.open_all(pipeline, preps)
        writer = stream.CompletionStream(preps, tok, call.model)
        return StreamingResponse(
            stream.body(pipeline, opened, writer),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )
    results = await prompt_batch.complete(pipeline, preps)
    return JSONResponse(translator.response_body(preps, results, tok, call.model), headers=headers)
