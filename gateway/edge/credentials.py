"""The one credential a request presents, read from its raw ASGI headers.

A key comes as ``Authorization: Bearer <key>`` or as ``x-api-key: <key>`` (Anthropic's
header), or where the API a request is for carries it (its registered ``credential``
reader, gateway/api/spec.py: Gemini's ``x-goog-api-key`` header or ``?key=``, say); all
may be sent if they name the same key. Authentication (gateway/edge/auth.py
``presented_secret``) and the rate limiter (gateway/edge/ratelimit.py) both call
:func:`request_credential`, so the key that is limited is always the key that is
authenticated. A request that presents more than one credential (several
``Authorization`` headers, several ``x-api-key`` headers, or two that name different
keys) is a 400: otherwise a second one could pick a fresh rate-limit bucket while the
first one authenticates.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Protocol

from starlette.types import Scope

from core.errors import APIError

ONE_CREDENTIAL = (
    "send one credential: a single 'Authorization: Bearer <key>' header or a single "
    "'x-api-key' header (or the API's own key field; several only if they carry the same "
    "key)"
)

# an API's own place for the key (ApiSpec.credential): the key, or None when absent
CredentialReader = Callable[[Scope], str | None]


class CredentialOwner(Protocol):
    """What an API registers about its key (gateway/api/spec.py ``ApiSpec``)."""

    @property
    def paths(self) -> tuple[str, ...]: ...

    @property
    def credential(self) -> CredentialReader | None: ...


def request_credential(scope: Scope) -> str | None:
    """The key a request presents: :func:`presented_credential` over its headers and what
    the readers of the registered APIs (``app.state.apis``) whose paths it is under find."""
    state = getattr(scope.get("app"), "state", None)
    apis: tuple[CredentialOwner, ...] = getattr(state, "apis", ())
    path = scope.get("path", "")
    own = [api.credential(scope) for api in apis if api.credential and path.startswith(api.paths)]
    return presented_credential(scope.get("headers") or (), own)


def presented_credential(
    headers: Iterable[tuple[bytes, bytes]], more: Iterable[str | None] = ()
) -> str | None:
    """The presented key, or None when there is none; 400 for more than one. ``more``:
    keys an API's own reader found.

    An ``Authorization`` header that is not ``Bearer`` carries no key (the ``x-api-key``
    header, if any, is the key); an empty one carries none either.
    """
    auth: list[bytes] = []
    api_key: list[bytes] = []
    for name, value in headers:
        if name == b"authorization":
            auth.append(value)
        elif name == b"x-api-key":
            api_key.append(value)
    if len(auth) > 1 or len(api_key) > 1:
        raise APIError(400, ONE_CREDENTIAL, param="authorization")
    bearer: str | None = None
    if auth:
        text = auth[0].decode("latin-1")
        if text[:7].lower() == "bearer ":
            bearer = text[7:].strip() or None
    key = api_key[0].decode("latin-1").strip() or None if api_key else None
    keys = [k for k in (bearer, key, *(m.strip() if m else None for m in more)) if k]
    if any(not hmac.compare_digest(keys[0].encode(), k.encode()) for k in keys[1:]):
        raise APIError(400, ONE_CREDENTIAL, param="authorization")
    return keys[0] if keys else None
