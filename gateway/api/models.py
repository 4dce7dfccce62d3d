"""The model list, in OpenAI's format or, asked with ``anthropic-version`` (Claude Code, the
Anthropic SDK), in Anthropic's. Any model name is served by the policy, so any resolves.

An OpenAI-format entry carries the policy's context length (the tokens prompt and answer
share) as ``context_length`` (the name OpenRouter's model list uses) and as
``max_model_len`` (vLLM's and SGLang's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.api.anthropic_messages.protocol import model_entry, models_body
from gateway.routes.request_context import gw_of, principal

router = APIRouter()


def wants_anthropic(request: Request) -> bool:
    return "anthropic-version" in request.headers


async def _openai_model(request: Request, name: str) -> dict[str, Any]:
    ctx = await gw_of(request).pipeline.context_length()
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "rlgate",
        "context_length": ctx,
        "max_model_len": ctx,
    }


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def models(request: Request) -> dict[str, Any]:
    name = gw_of(request).settings.served_model_name
    await principal(request)
    if wants_anthropic(request):
        return models_body(name)
    return {"object": "list", "data": [await _openai_model(request, name)]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict[str, Any]:
    """One model (Claude Code asks for its own name)."""
    await principal(request)
    if wants_anthropic(request):
        return model_entry(model_id)
    return await _openai_model(request, model_id)
