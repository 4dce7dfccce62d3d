"""Client-facing errors (core.errors.APIError), rendered in the calling API's own error
format: the format an API registers (gateway/api/spec.py), else the gateway's own
(OpenAI's)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import Scope, Send

from core.errors import APIError

# The gateway's own error format (OpenAI's; the APIs register theirs, gateway/api/spec.py):
# the error `type` for each status.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


@dataclass(frozen=True)
class ErrorFormat:
    """An error body's shape (``shape(type, err)``) and its ``type`` for each status."""

    types: Mapping[int, str]
    fallback: str  # the type of a status ``types`` does not list
    shape: Callable[[str, APIError], dict[str, Any]]

    def kind(self, status: int) -> str:
        """The error ``type`` of ``status``: the one table for HTTP errors and the error
        events that end a stream alike (each API's stream writer reads it)."""
        return self.types.get(status, self.fallback)

    def body(self, err: APIError) -> dict[str, Any]:
        return self.shape(self.kind(err.status), err)


def _openai_shape(kind: str, err: APIError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


OPENAI = ErrorFormat(_OPENAI_TYPES, "invalid_request_error", _openai_shape)


class ErrorOwner(Protocol):
    """What an API registers about its errors (gateway/api/spec.py ``ApiSpec``)."""

    @property
    def paths(self) -> tuple[str, ...]: ...

    @property
    def errors(self) -> ErrorFormat | None: ...

    @property
    def error_header(self) -> str | None: ...


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def error_format(scope: Scope) -> ErrorFormat:
    """The error format of the API a request is for: a registered API (``app.state.apis``,
    set by gateway/app.py) with its own format whose paths the request is under or whose
    header it carries (Anthropic's ``anthropic-version``); the gateway's own otherwise."""
    app = scope.get("app")
    apis: tuple[ErrorOwner, ...] = getattr(getattr(app, "state", None), "apis", ())
    path = scope.get("path", "")
    headers = Headers(scope=scope)
    for api in apis:
        if api.errors is not None and (
            path.startswith(api.paths) or (api.error_header and api.error_header in headers)
        ):
            return api.errors
    return OPENAI


async def send_error(scope: Scope, send: Send, err: APIError, close: bool = False) -> None:
    """Answer ``err`` from pure ASGI middleware, in the caller's error format
    (``close``: ask the client to close the connection)."""
    body = json.dumps(error_format(scope).body(err)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_response(request: Request, err: APIError) -> JSONResponse:
    body = error_format(request.scope).body(err)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def db_down_error() -> APIError:
    """The 503 for a request that needs the database while it is down (core.db.DB_DOWN)
    and this gateway has no recent copy of what it needs."""
    return APIError(
        503,
        "the database is unreachable and this gateway has no recent copy of what the "
        "request needs; retry shortly",
        headers={"Retry-After": "5"},
    )
