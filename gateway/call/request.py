"""The one internal request type every client API translates into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas import sampling_fields


@dataclass
class ToolCallOut:
    """A tool call, in a message the client sent back or in the model's output."""

    id: str
    name: str
    arguments: str  # JSON text as the model wrote it; a custom call's free-form input
    custom: bool = False  # a call of a custom tool (Responses ``custom_tool_call``)
    cut: bool = False  # cut by the output limit: its arguments as generated so far


@dataclass
class Message:
    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None


@dataclass(frozen=True)
class CustomFormat:
    """A custom tool's input format (Responses ``format``): ``syntax`` text | lark | regex,
    the ``definition`` as sent, and ``at``, the request field that holds it (errors name
    it). Its EBNF is built only to force a call (gateway/call/custom_tools.py)."""

    syntax: str = "text"
    definition: str = ""
    at: str = ""


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    custom: CustomFormat | None = None  # a Responses custom tool: free-form text input


@dataclass
class Sampling:
    # the table's fields (schemas/sampling_fields.py) by internal name; one left out: default
    values: dict[str, float] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: str | None = None  # structured output: SGLang's json_schema param (JSON text)

    def __post_init__(self) -> None:
        self.values = {**sampling_fields.defaults(), **self.values}


@dataclass
class GenerationRequest:
    protocol: str  # openai-chat | openai-responses | anthropic-messages | openai-completions
    model: str
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True  # False: a forced turn makes exactly one call
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    include_usage: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    user: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    session_hint: str | None = None  # a client's own session id (header or metadata)
    raw: dict[str, Any] = field(default_factory=dict)  # the request as the client sent it
    # A raw prompt (the Completions API): its text, tokenized without a chat template, or
    # its token ids as the client sent them. ``messages`` then holds it as one user message
    # (what sessions hash and the dashboard shows).
    raw_prompt: str | list[int] | None = None
    return_token_ids: bool = False  # vLLM's opt-in: the answer carries prompt and output ids
    prompt_logprobs: bool = False  # the engine returns the prompt's logprobs too (echo)


@dataclass
class Completion:
    """One finished choice: token-exact engine output plus its parsed form."""

    index: int
    output_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    text: str  # decoded completion text (as the engine returned it)
    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCallOut]
    finish_reason: str  # stop | length | tool_calls | abort
    prompt_tokens: int
    cached_tokens: int = 0
    # with ``GenerationRequest.prompt_logprobs``: each prompt token's logprob (the first
    # None) and top alternatives (None first), as the engine returned them
    prompt_logprobs: list[float | None] | None = None
    prompt_top: list[list[tuple[int, float]] | None] | None = None
