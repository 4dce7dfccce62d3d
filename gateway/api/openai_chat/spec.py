"""What OpenAI Chat Completions registers with the gateway (gateway/api/spec.py)."""

from gateway.api.openai_chat import translator
from gateway.api.openai_chat.router import router
from gateway.api.spec import ApiSpec

API = ApiSpec.of(translator, router, {"/v1/chat/completions", "/chat/completions"})
