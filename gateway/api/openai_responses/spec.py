"""What OpenAI Responses registers with the gateway (gateway/api/spec.py)."""

from gateway.api.openai_responses import translator
from gateway.api.openai_responses.router import router
from gateway.api.spec import ApiSpec

API = ApiSpec.of(
    translator,
    router,
    {"/v1/responses", "/responses"},
    shaped=lambda request: "input" in request or "instructions" in request,
)
