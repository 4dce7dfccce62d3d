"""OpenAI Chat Completions: the request model and the shapes of the answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gateway.api.base import Loose, with_call_fields
from gateway.call.request import Completion, ToolCallOut
from schemas import sampling_fields

MAX_N = 8


@with_call_fields(sampling_fields.CHAT)
class ChatRequest(Loose):
    model: str = "rlgate-policy"
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    return_token_ids: bool = False  # vLLM's: prompt_token_ids, and token_ids per choice


# accepted and ignored: they do not change what the model generates
IGNORED = {
    "store",
    "service_tier",
    "reasoning_effort",
    "prediction",
    "web_search_options",
    "modalities",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
}
DEPRECATED = "'functions'/'function_call' are deprecated; use 'tools'"
REFUSED = {"functions": (DEPRECATED, "functions"), "function_call": (DEPRECATED, "functions")}


def tool_call_json(c: ToolCallOut) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def usage_json(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached``: prompt tokens the engine took from its prefix
    cache (``prompt_tokens_details.cached_tokens``, as OpenAI reports prompt caching)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def calls_usage(calls: list[tuple[int, list[Completion]]]) -> dict[str, Any]:
    """The usage of one or more calls (prompt tokens, their finished choices): tokens
    summed; cached, per call the least any of its choices found."""
    return usage_json(
        sum(p for p, _ in calls),
        sum(len(c.output_ids) for _, cs in calls for c in cs),
        sum(min((c.cached_tokens for c in cs), default=0) for _, cs in calls),
    )


def chunk_choice(
    index: int, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None
) -> dict[str, Any]:
    """One choice of a ``chat.completion.chunk``."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
