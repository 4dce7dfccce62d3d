"""Anthropic Messages API routes: /v1/messages, /v1/messages/count_tokens, models.

Auth is ``x-api-key`` or ``Authorization: Bearer``; ``anthropic-version`` and
``anthropic-beta`` headers are accepted (and not required); ``?beta=true`` is ignored.
Errors under /v1/messages come out in Anthropic's ``{"type": "error", ...}`` shape
(gateway.errors.error_style).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core.errors import APIError
from gateway import anthropic_messages as am
from gateway.routing import gw_of, headers_for, principal, read_json
from gateway.service import open_stream

router = APIRouter()


def wants_anthropic(request: Request) -> bool:
    return "anthropic-version" in request.headers


def models_response(request: Request) -> dict[str, Any]:
    """Anthropic's model list (for app.py's GET /v1/models when ``anthropic-version`` is
    present); the caller has already authenticated."""
    return am.models_body(gw_of(request).settings.served_model_name)


@router.post("/v1/messages")
@router.post("/messages", include_in_schema=False)
async def messages(request: Request) -> Response:
    gw = gw_of(request)
    p = await principal(request)
    body = await read_json(request)
    req = am.to_internal(body, request.headers.get("x-session-id"))
    try:
        prep = await gw.pipeline.prepare(p, req, "msg_")
    except APIError as e:
        if e.param != "max_tokens":
            raise
        # max_tokens is an upper bound: Claude Code asks for 32000 whatever the model's
        # context; use what the context leaves after the prompt instead of refusing
        req.sampling.max_tokens = None
        prep = await gw.pipeline.prepare(p, req, "msg_")
    model = gw.settings.served_model_name
    if req.stream:
        events, first = await open_stream(gw.pipeline, prep)
        return StreamingResponse(
            am.stream_body(gw.pipeline, prep, events, first, gw.tokenizer, model),
            media_type="text/event-stream",
            headers={**headers_for(prep), "Cache-Control": "no-cache"},
        )
    (completion,) = await gw.pipeline.run(prep)
    await gw.pipeline.record(prep, [completion])
    return JSONResponse(
        am.message_body(prep, completion, gw.tokenizer, model, gw.pipeline.renderer.context_length),
        headers=headers_for(prep),
    )


@router.post("/v1/messages/count_tokens")
@router.post("/messages/count_tokens", include_in_schema=False)
async def count_tokens(request: Request) -> dict[str, Any]:
    gw = gw_of(request)
    p = await principal(request)
    if p.kind not in ("agent", "admin"):
        raise APIError(403, f"a {p.kind} key cannot call models; use an agent key")
    body = await read_json(request)
    req = am.to_internal(body, None, count_only=True)
    return await am.count_body(gw.pipeline, req)


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict[str, Any]:
    """One model, in Anthropic's format when asked with ``anthropic-version``. Any name
    is served by the policy, so any name resolves (Claude Code asks for its own)."""
    await principal(request)
    if wants_anthropic(request):
        return am.model_entry(model_id)
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "rlgate"}
