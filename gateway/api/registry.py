"""The client APIs the gateway serves: each package's ``spec.API``, in the order a stored
request whose id names no API is matched by its shape (Responses before Anthropic; Chat
Completions, first here, is what a request of no known shape is read as)."""

from __future__ import annotations

from gateway.api.anthropic_messages.spec import API as ANTHROPIC_MESSAGES
from gateway.api.openai_chat.spec import API as OPENAI_CHAT
from gateway.api.openai_completions.spec import API as OPENAI_COMPLETIONS
from gateway.api.openai_responses.spec import API as OPENAI_RESPONSES
from gateway.api.spec import ApiSpec

APIS: tuple[ApiSpec, ...] = (OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_RESPONSES, ANTHROPIC_MESSAGES)
DEFAULT = OPENAI_CHAT  # how a stored request of no known API and no known shape is read
