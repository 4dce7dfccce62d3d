"""The one credential a request presents, read from its raw ASGI headers.

A key comes as ``Authorization: Bearer <key>`` or as ``x-api-key: <key>`` (Anthropic's
header); both may be sent if they name the same key. Authentication
(gateway/edge/auth.py ``presented_secret``) and the rate limiter (gateway/edge/ratelimit.py) both
call :func:`presented_credential`, so the key that is limited is always the key that is
authenticated. A request that presents more than one credential (several
``Authorization`` headers, several ``x-api-key`` headers, or the two naming different
keys) is a 400: otherwise a second header could pick a fresh rate-limit bucket while the
first one authenticates.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from core.errors import APIError

ONE_CREDENTIAL = (
    "send one credential: a single 'Authorization: Bearer <key>' header or a single "
    "'x-api-key' header (both only if they carry the same key)"
)


def presented_credential(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The presented key, or None when there is none; 400 for more than one.

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
    if bearer and key and not hmac.compare_digest(bearer.encode(), key.encode()):
        raise APIError(400, ONE_CREDENTIAL, param="authorization")
    return bearer or key
