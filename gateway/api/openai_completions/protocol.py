"""OpenAI Completions (legacy): the request model and the shapes of the answers."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.api.base import Loose
from gateway.api.openai_chat.protocol import MAX_N

MAX_PROMPTS = 16  # prompts in one call (each is its own interaction, n choices each)
MAX_LOGPROBS = 20  # alternatives per position, as Chat Completions' top_logprobs
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this API


class CompletionRequest(Loose):
    model: str = "rlgate-policy"
    prompt: Any = Field(...)
    suffix: str | None = None
    # 0: nothing generated (with ``echo``: the prompt, and its logprobs, scored)
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's and SGLang's
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
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False


def choice_json(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    """One choice of a ``text_completion`` (or of one of its stream chunks)."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
