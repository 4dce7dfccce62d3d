"""Client-facing errors (core.errors.APIError), rendered in the calling API's own error format."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from core.errors import APIError

# OpenAI error `type` for each status; Anthropic uses its own names.
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
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def error_style(request: Request) -> str:
    path = request.url.path
    if path.startswith("/v1/messages") or path.startswith("/messages"):
        return "anthropic"
    if "anthropic-version" in request.headers:
        return "anthropic"
    return "openai"


def error_body(style: str, err: APIError) -> dict[str, Any]:
    if style == "anthropic":
        kind = _ANTHROPIC_TYPES.get(err.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}}
    kind = _OPENAI_TYPES.get(err.status, "invalid_request_error")
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


async def send_error(scope: dict[str, Any], send: Any, err: APIError, close: bool = False) -> None:
    """Answer ``err`` from pure ASGI middleware, in the caller's error format
    (``close``: ask the client to close the connection)."""
    body = json.dumps(error_body(error_style(Request(scope)), err)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_response(request: Request, err: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(error_style(request), err), status_code=err.status, headers=err.headers
    )


def db_down_error() -> APIError:
    """The 503 for a request that needs the database while it is down (core.db.DB_DOWN)
    and this gateway has no recent copy of what it needs."""
    return APIError(
        503,
        "the database is unreachable and this gateway has no recent copy of what the "
        "request needs; retry shortly",
        headers={"Retry-After": "5"},
    )
