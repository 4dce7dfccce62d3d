"""The model list, in OpenAI's format or, asked with ``anthropic-version`` (Claude Code, the
Anthropic SDK), in Anthropic's. Any model name is served by the policy, so any resolves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.api.anthropic_messages.protocol import model_entry, models_body
from gateway.routing import gw_of, principal

router = APIRouter()


def wants_anthropic(request: Request) -> bool:
    return "anthropic-version" in request.headers


def _openai_model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "rlgate"}


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def models(request: Request) -> dict[str, Any]:
    name = gw_of(request).settings.served_model_name
    await principal(request)
    if wants_anthropic(request):
        return models_body(name)
    return {"object": "list", "data": [_openai_model(name)]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict[str, Any]:
    """One model (Claude Code asks for its own name)."""
    await principal(request)
    if wants_anthropic(request):
        return model_entry(model_id)
    return _openai_model(model_id)
