"""A stored request's conversation for the dashboard, read by the translator of the API
that took it (the interaction id's prefix names it: ``chatcmpl-``, ``msg_``, ``resp_``,
``cmpl-``)."""

from __future__ import annotations

from typing import Any

from gateway.api.anthropic_messages import translator as anthropic_messages
from gateway.api.openai_chat import translator as openai_chat
from gateway.api.openai_completions import translator as openai_completions
from gateway.api.openai_responses import translator as openai_responses

TRANSLATORS = (openai_chat, anthropic_messages, openai_responses, openai_completions)


def request_messages(request: dict[str, Any], interaction_id: str = "") -> list[dict[str, Any]]:
    """The messages of ``request`` as role / text / tool calls. A record whose id names no
    API (written by other tools) is read by its shape: Responses' ``input``, Anthropic's
    ``system``, else OpenAI chat."""
    for t in TRANSLATORS:
        if interaction_id.startswith(t.ID_PREFIX):
            return t.display_messages(request)
    if "input" in request or "instructions" in request:
        return openai_responses.display_messages(request)
    if "system" in request:
        return anthropic_messages.display_messages(request)
    return openai_chat.display_messages(request)
