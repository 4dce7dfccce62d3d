"""What OpenAI Responses registers with the gateway (gateway/api/spec.py)."""

from gateway.api.openai_responses import translator
from gateway.api.openai_responses.router import router
from gateway.api.spec import ApiSpec

API = ApiSpec(
    protocol=translator.PROTOCOL,
    id_prefix=translator.ID_PREFIX,
    router=router,
    model_paths=frozenset({"/v1/responses", "/responses"}),
    display=translator.display_messages,
    shaped=lambda request: "input" in request or "instructions" in request,
)
