"""Anthropic Messages: the request model and the shapes of the answers."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from core.errors import APIError
from gateway.api.base import Loose, with_call_fields
from gateway.call.partial_json import parse_partial
from gateway.edge.errors import ErrorFormat
from schemas import sampling_fields

# blocks the served model cannot read (it reads text)
MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")
INVALID = "{loc}: {msg}"  # Anthropic's wording of a validation error


@with_call_fields(sampling_fields.MESSAGES)
class MessagesRequest(Loose):
    model: str = Field(min_length=1)
    messages: list[Any] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    system: str | list[Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    return_token_ids: bool = False  # vLLM's opt-in; rlgate's place: the Message object


# accepted and ignored: they do not change what the model generates here
IGNORED = {
    "service_tier",
    "container",
    "context_management",
    "mcp_servers",
    "cache_control",
    "inference_geo",
    "speed",
    "diagnostics",
    "workspace_id",
    "user_profile_id",
    "billing_policy",
    "fallbacks",
    "fallback_credit_token",
    "betas",
}


def tool_input(arguments: str, cut: bool = False) -> dict[str, Any]:
    """A tool call's arguments as the object ``tool_use.input`` must be. A call cut by the
    output limit (gateway/call/cut_calls.py) has its arguments read as far as they parse, as
    Anthropic answers a ``tool_use`` cut by ``max_tokens`` (gateway/call/partial_json.py);
    a custom tool's cut input (raw text) stays text."""
    if cut:
        value = parse_partial(arguments)
        if isinstance(value, dict):
            return value
        return {"arguments": arguments} if arguments else {}
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def usage_json(input_tokens: int, output_tokens: int, cached: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def message_json(
    mid: str, model: str, content: list[dict[str, Any]], usage: dict[str, Any], **stop: Any
) -> dict[str, Any]:
    """A ``message`` object (``stop`` holds stop_reason and stop_sequence)."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop.get("stop_reason"),
        "stop_sequence": stop.get("stop_sequence"),
        "usage": usage,
    }


# ---- errors -------------------------------------------------------------------------

# Anthropic's error ``type`` for each status
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


def error_json(kind: str, err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": err.message}}


ERRORS = ErrorFormat(ERROR_TYPES, "api_error", error_json)


# ---- models -------------------------------------------------------------------------

MODEL_CREATED_AT = "2025-01-01T00:00:00Z"


def model_entry(name: str) -> dict[str, Any]:
    return {"type": "model", "id": name, "display_name": name, "created_at": MODEL_CREATED_AT}


def models_body(name: str) -> dict[str, Any]:
    return {"data": [model_entry(name)], "has_more": False, "first_id": name, "last_id": name}
