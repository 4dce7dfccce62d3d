"""OpenAI Responses: the request model and the shapes of the answers (the Response
object and its output items)."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import Field

from gateway.api.base import Loose, with_call_fields
from gateway.call.request import Completion, ToolCallOut
from schemas import sampling_fields


@with_call_fields(sampling_fields.RESPONSES)
class ResponsesRequest(Loose):
    model: str = "rlgate-policy"
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    store: bool | None = True
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None  # conversations.py
    parallel_tool_calls: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    background: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[Any] | None = None
    truncation: str | None = None
    return_token_ids: bool = False  # vLLM's opt-in; rlgate's place: the Response object


# accepted and ignored: they do not change what the model generates here.
# ``client_metadata`` is Codex's (0.17x sends installation/turn/window ids in it with
# every request; the recorded request keeps it as sent).
IGNORED = {
    "prompt_cache_key",
    "service_tier",
    "safety_identifier",
    "stream_options",
    "client_metadata",
}
REFUSED: dict[str, tuple[str, str]] = {}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def call_item(
    item_id: str, call: ToolCallOut, status: str = "completed", ns: dict[str, str] | None = None
) -> dict[str, Any]:
    """A ``function_call`` item, or a ``custom_tool_call`` for a custom call; one cut by
    the output limit (gateway/call/cut_calls.py) is ``incomplete``, its arguments as cut."""
    if call.cut and status == "completed":
        status = "incomplete"
    if call.custom:
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call.id,
            "name": call.name,
            "input": call.arguments,
            "status": status,
        }
    item = {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }
    if ns and call.name in ns:
        item["namespace"] = ns[call.name]
    return item


def response_json(
    *,
    rid: str,
    raw: dict[str, Any],
    temperature: float,
    top_p: float,
    prompt_tokens: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    completion: Completion | None,
    created: int,
) -> dict[str, Any]:
    """The Response object of request ``raw`` (also for a stored response rebuilt from its
    record)."""
    out_tokens = len(completion.output_ids) if completion else 0
    # "incomplete" means the client's own max_output_tokens was reached. A client that set
    # none (Codex sets none) gets "completed" when the gateway's RLGATE_DEFAULT_MAX_TOKENS
    # or the model's context cut the answer; the record keeps finish_reason "length".
    incomplete = (
        completion is not None
        and completion.finish_reason == "length"
        and raw.get("max_output_tokens") is not None
    )
    if incomplete and status == "completed":
        status = "incomplete"
    conversation = raw.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    body = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": raw.get("instructions"),
        "max_output_tokens": raw.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": raw.get("parallel_tool_calls", True),
        "previous_response_id": raw.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": raw.get("store", True),
        "temperature": temperature,
        "text": raw.get("text") or {"format": {"type": "text"}},
        "tool_choice": raw.get("tool_choice", "auto"),
        "tools": raw.get("tools") or [],
        "top_p": top_p,
        "truncation": raw.get("truncation") or "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": completion.cached_tokens if completion else 0,
                "cache_write_tokens": 0,
            },
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + out_tokens,
        },
        "user": raw.get("user"),
        "metadata": raw.get("metadata") or {},
    }
    if conversation is not None:  # OpenAI's field, only for a call that named one
        body["conversation"] = {"id": conversation}
    return body
