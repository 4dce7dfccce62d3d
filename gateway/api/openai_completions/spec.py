"""What OpenAI Completions registers with the gateway (gateway/api/spec.py)."""

from gateway.api.openai_completions import translator
from gateway.api.openai_completions.router import router
from gateway.api.spec import ApiSpec

API = ApiSpec(
    protocol=translator.PROTOCOL,
    id_prefix=translator.ID_PREFIX,
    router=router,
    model_paths=frozenset({"/v1/completions", "/completions"}),
    display=translator.display_messages,
)
