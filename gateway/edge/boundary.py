"""Refuse, before any route runs, a URL that holds a character no id or filter can hold.

PostgreSQL stores no NUL character (``%00``) in text, so an id or a filter value with
one used to reach the database and come back as a 500. As pure ASGI middleware, for
every route (the client APIs, the admin API and the dashboard alike):

- a NUL (or an unpaired UTF-16 surrogate) in the URL **path** is a 404: no id holds
  one, so whatever the path names does not exist;
- one in a **query parameter** (its name or value) is a 400 naming the parameter
  (``pairs_error``, which the dashboard's form reader uses for its fields too).

Both in the caller's error format (gateway.edge.errors).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from core.errors import APIError
from gateway.edge.errors import send_error
from gateway.edge.storable import bad_char, unstorable


def url_error(scope: Scope) -> APIError | None:
    """The answer for a path or query string that holds an unstorable character."""
    if unstorable(scope.get("path", "")):
        return APIError(
            404,
            "not found: the URL path contains a NUL character (%00) or an unpaired "
            "surrogate, which no id holds",
        )
    query = scope.get("query_string", b"").decode("latin-1")
    if "%" not in query and "\x00" not in query:
        return None
    return pairs_error(parse_qsl(query, keep_blank_values=True), "query parameter")


def pairs_error(pairs: Iterable[tuple[str, str]], what: str) -> APIError | None:
    """The 400 for the first name or value that holds an unstorable character, naming
    it (``what``: "query parameter", "form field"); None if all can be stored."""
    for name, value in pairs:
        if unstorable(name):
            return bad_char(f"a {what} name", name, what)
        if unstorable(value):
            return bad_char(f"the {what} '{name}'", value, name)
    return None


class UrlCheckMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = url_error(scope) if scope["type"] == "http" else None
        if err is None:
            await self.app(scope, receive, send)
            return
        await send_error(scope, send, err)
