"""The request body size limit (``RLGATE_MAX_BODY_BYTES``), as pure ASGI middleware.

A body over the limit is answered with a 413 in the calling API's error format, before
the gateway holds more than the limit in memory:

- a ``Content-Length`` over the limit is refused before any of the body is read;
- a body without one (chunked) is counted as the route reads it, and the read fails
  with the 413 as soon as the count passes the limit.

Either way the rest of the body is read and discarded (up to ``DRAIN_BYTES``, never
kept) before the answer goes out: a server that answers and closes while the client is
still sending makes the client's TCP stack see a reset, and many clients then report a
broken connection instead of the 413. Past ``DRAIN_BYTES`` the connection is just closed
after the answer.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import APIError
from gateway.edge.errors import send_error

DRAIN_BYTES = 64 * 1024 * 1024


def too_large(limit: int, size: int | None = None) -> APIError:
    got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return APIError(
        413,
        f"the request body is {got}; this gateway accepts at most {limit} bytes "
        "(RLGATE_MAX_BODY_BYTES). Shorten the conversation (fewer or shorter messages, "
        "tool results or tool descriptions) or raise the limit",
    )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _drain(receive, declared)
            await send_error(scope, send, too_large(self.max_bytes, declared), close=True)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(receive, None)
                    raise too_large(self.max_bytes)  # the app's handler answers it
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive: Receive, declared: int | None) -> None:
    """Read and drop the rest of the request body, up to DRAIN_BYTES."""
    if declared is not None and declared > DRAIN_BYTES:
        return
    dropped = 0
    while dropped <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
