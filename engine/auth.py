"""``--api-key``: the engine's bearer-token check, as SGLang's server does it.

With a key set, every request must carry ``Authorization: Bearer <key>``, except
``OPTIONS`` requests and exactly ``/health`` and ``/metrics`` (left open for load
balancers and probes); anything else gets 401 ``{"error": "Unauthorized"}``. Without a
key every route is open, as in SGLang.

One deliberate difference from SGLang (0.5.23, ``sglang/srt/utils/auth.py``
``decide_request_auth``): SGLang leaves every path that *starts with* ``/health``,
``/ready`` or ``/metrics`` open, so ``/health_generate``, which runs a generation, needs
no key there. Here the open paths match exactly, so ``/health_generate`` needs the key.

A plain ASGI middleware (not Starlette's ``BaseHTTPMiddleware``), so ``/generate`` still
sees a client disconnect and aborts the request.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health", "/metrics"})  # exact: see the module docstring
_UNAUTHORIZED = json.dumps({"error": "Unauthorized"}).encode()


class ApiKeyMiddleware:
    """Refuse requests without ``Authorization: Bearer <api_key>`` (401)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("an empty --api-key would protect nothing")
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    def allowed(self, scope: Scope) -> bool:
        if scope.get("method") == "OPTIONS" or scope["path"] in OPEN_PATHS:
            return True
        sent = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                sent = value
                break
        return hmac.compare_digest(sent, self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_UNAUTHORIZED)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})
