"""What Anthropic Messages registers with the gateway (gateway/api/spec.py): its errors
are Anthropic's under its paths, and on any path a client sends ``anthropic-version``."""

from gateway.api.anthropic_messages import translator
from gateway.api.anthropic_messages.protocol import ERRORS
from gateway.api.anthropic_messages.router import router
from gateway.api.spec import ApiSpec

API = ApiSpec.of(
    translator,
    router,
    {"/v1/messages", "/messages"},
    errors=ERRORS,
    error_header="anthropic-version",
    shaped=lambda request: "system" in request,
)
