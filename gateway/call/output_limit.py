"""What an API's output limit (``max_tokens``, ``max_output_tokens``) means: the one place
that turns the limit a client asked for and the context window into the engine's
``max_new_tokens``, and says what set it (which is what a cut answer's stop reason is).

The prompt and the answer share the model's context. A prompt that fills it is refused. A
limit the client set is the engine's limit if it fits; if it does not, it is refused (400
naming ``max_tokens``), unless the API treats it as an upper bound (``fit``: Anthropic
Messages, where Claude Code asks for 32000 whatever the model's context): then the answer
gets what the context leaves, or the gateway's RLGATE_DEFAULT_MAX_TOKENS if smaller, as
when the client set no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.edge.errors import bad_request

LimitedBy = Literal["client", "default", "context"]


@dataclass(frozen=True)
class OutputLimit:
    """The engine's ``max_new_tokens`` and what set it: the client's own limit, the
    gateway's default, or the room the context leaves. An answer cut at the limit
    (finish_reason ``length``) reached the client's limit only when ``by`` is ``client``;
    the APIs name their stop reasons from it (Anthropic ``max_tokens`` /
    ``model_context_window_exceeded`` / ``end_turn``)."""

    tokens: int
    by: LimitedBy

    @property
    def client_limit(self) -> bool:
        return self.by == "client"


def output_limit(
    requested: int | None,
    prompt_tokens: int,
    context: int,
    default: int | None,
    *,
    fit: bool = False,
    where: str = "messages",
) -> OutputLimit:
    """The engine's limit for a prompt of ``prompt_tokens`` in a ``context``-token window;
    ``where`` is what the client calls the prompt (``messages`` or ``prompt``)."""
    if prompt_tokens >= context:
        raise bad_request(
            f"the prompt is {prompt_tokens} tokens but the model's context is {context} "
            "tokens; shorten the conversation, serve a policy with a longer context, or trim "
            "the client's own prompt (docs/clients/ in the rlgate repository has trimmed "
            "configurations for Claude Code, OpenClaw and Codex)",
            where,
        )
    room = context - prompt_tokens
    if requested is not None:
        if requested <= room:
            return OutputLimit(requested, "client")
        if not fit:
            raise bad_request(
                f"this model's maximum context length is {context} tokens; you requested "
                f"{prompt_tokens + requested} ({prompt_tokens} in the {where}, {requested} "
                f"for the completion); reduce max_tokens or the {where}",
                "max_tokens",
            )
    if default and default < room:
        return OutputLimit(default, "default")
    return OutputLimit(room, "context")
