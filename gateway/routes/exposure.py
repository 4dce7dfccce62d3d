"""What the operational endpoints show to whom.

- ``GET /health``: without an admin key only ``{"status": ...}`` (liveness, same status
  code); with one, the whole body (engine URLs, recording backlog, ...).
- ``GET /metrics``: needs an admin key unless ``RLGATE_METRICS_PUBLIC=true``.
- ``GET /openapi.json``: needs an admin key unless ``RLGATE_DOCS_PUBLIC=true``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from core.errors import APIError
from gateway.edge.auth import presented_secret
from gateway.routes.request_context import gw_of

PUBLIC_HEALTH_FIELDS = ("status",)


async def is_admin(request: Request) -> bool:
    """Whether the caller presents a usable admin key (a bad key is simply not one)."""
    secret = presented_secret(request)
    if not secret:
        return False
    auth = gw_of(request).auth
    try:
        p = auth.cached(secret) or await asyncio.to_thread(auth.resolve, secret)
    except APIError:
        return False
    return p.kind == "admin"


async def require_admin(request: Request, public: bool = False) -> None:
    """401 without a key, 403 with a key that is not an admin key; nothing if public."""
    if public:
        return
    secret = presented_secret(request)
    if not secret:
        raise APIError(401, "this endpoint needs an admin key: send 'Authorization: Bearer <key>'")
    auth = gw_of(request).auth
    p = auth.cached(secret) or await asyncio.to_thread(auth.resolve, secret)
    if p.kind != "admin":
        raise APIError(403, f"this endpoint needs an admin key, not a {p.kind} key")


def admin_details(
    handler: Callable[[Request], Awaitable[JSONResponse]],
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a JSON health handler: callers without an admin key get only its status."""

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        resp = await handler(request)
        if await is_admin(request):
            return resp
        body: Any = json.loads(bytes(resp.body))
        public = {k: body[k] for k in PUBLIC_HEALTH_FIELDS if k in body}
        return JSONResponse(public, status_code=resp.status_code)

    return wrapper


def install_openapi(app: FastAPI, path: str = "/openapi.json") -> None:
    """Serve the OpenAPI schema at ``path``, behind an admin key unless docs are public
    (create the app with ``openapi_url=None`` so FastAPI's open route is not there)."""

    @app.get(path, include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        await require_admin(request, gw_of(request).settings.docs_public)
        return JSONResponse(app.openapi())
