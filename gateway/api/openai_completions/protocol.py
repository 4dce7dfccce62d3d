"""OpenAI Completions (legacy): the request model and the shapes of the answers."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.api.base import Loose, with_call_fields
from gateway.api.openai_chat.protocol import MAX_N
from schemas import sampling_fields

MAX_PROMPTS = 16  # prompts in one call (each is its own interaction, n choices each)
MAX_LOGPROBS = 20  # alternatives per position, as Chat Completions' top_logprobs
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this API


@with_call_fields(sampling_fields.COMPLETIONS)
class CompletionRequest(Loose):
    model: str = "rlgate-policy"
    prompt: Any = Field(...)
    suffix: str | None = None
    # 0: nothing generated (with ``echo``: the prompt, and its logprobs, scored)
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0)
    n: int = Field(1, ge=1, le=MAX_N)
    best_of: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False


def choice_json(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    """One choice of a ``text_completion`` (or of one of its stream chunks)."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
