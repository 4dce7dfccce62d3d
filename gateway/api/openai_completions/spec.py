"""What OpenAI Completions registers with the gateway (gateway/api/spec.py)."""

from gateway.api.openai_completions import translator
from gateway.api.openai_completions.router import router
from gateway.api.spec import ApiSpec

API = ApiSpec.of(translator, router, {"/v1/completions", "/completions"})
