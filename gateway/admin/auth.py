"""Who is calling the dashboard or its API: the signed session cookie, or an admin key.

An admin key logs in once (form); the browser then holds a signed session cookie
(``rlgate_admin``: HMAC-SHA256, HttpOnly, SameSite=Strict, Path=/admin, 12 h). The signing
secret is derived from ``RLGATE_ADMIN_KEY`` when set (every replica with the same key
accepts the same cookies), else read from ``<data_dir>/admin_secret`` (created once, 0600).
The cookie carries the session's CSRF token; the JSON API also accepts an admin key as
``Authorization: Bearer`` (no cookie, so no CSRF token needed).

Scope: the bootstrap admin (``RLGATE_ADMIN_KEY``) sees every project; an admin key
created for a project sees and acts on that project only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request

from core.errors import APIError
from gateway.admin.actions import ActionError
from gateway.edge.auth import BOOTSTRAP_ADMIN_ID, Principal, presented_secret
from gateway.routes.request_context import gw_of
from schemas.tables import ApiKeyRow

COOKIE = "rlgate_admin"
PRE_COOKIE = "rlgate_admin_login"
SESSION_TTL_S = 12 * 3600

# ---- session cookie -----------------------------------------------------------------

_secrets: dict[str, bytes] = {}


def signing_secret(request: Request) -> bytes:
    settings = gw_of(request).settings
    if settings.admin_key:
        raw = settings.admin_key.get_secret_value().encode()
        return hmac.new(b"rlgate-admin-session-v1", raw, hashlib.sha256).digest()
    path = Path(settings.data_dir) / "admin_secret"
    cached = _secrets.get(str(path))
    if cached:
        return cached
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        value = path.read_text().strip()
    else:
        value = secrets.token_hex(32)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
    if len(value) < 32:
        raise RuntimeError(f"{path} holds no usable secret; delete it to make a new one")
    _secrets[str(path)] = value.encode()
    return _secrets[str(path)]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(secret: bytes, payload: dict[str, Any]) -> str:
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    mac = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unsign(secret: bytes, value: str | None) -> dict[str, Any] | None:
    if not value or "." not in value:
        return None
    body, _, mac = value.partition(".")
    want = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), want):
            return None
        payload = json.loads(_unb64(body))
    except (ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or float(payload.get("exp", 0)) < time.time():
        return None
    return payload


def secure(request: Request) -> bool:
    """Whether cookies get ``Secure``: the request came over HTTPS (or says so via a proxy)."""
    proto = request.headers.get("x-forwarded-proto") or request.url.scheme
    return proto == "https"


def csrf_ok(presented: str, expected: str | None) -> bool:
    return hmac.compare_digest(presented.encode(), (expected or "").encode())


# ---- who is asking ------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    principal: Principal
    csrf: str | None  # None: bearer-key API call (no cookie, no CSRF needed)

    @property
    def scope(self) -> list[str] | None:
        return None if self.principal.key_id == BOOTSTRAP_ADMIN_ID else [self.principal.project_id]

    @property
    def actor(self) -> str:
        return f"admin:{self.principal.key_id}"


def project_for(ctx: Ctx, project: str | None) -> str:
    """The project an action names (default: the key's own), if the caller may act on it."""
    project = project or ctx.principal.project_id
    if ctx.scope is not None and project not in ctx.scope:
        raise ActionError(404, f"no project {project!r}")
    return project


def _still_valid(request: Request, payload: dict[str, Any]) -> Principal | None:
    gw = gw_of(request)
    key_id = str(payload.get("k", ""))
    if key_id == BOOTSTRAP_ADMIN_ID:
        if not gw.settings.admin_key:
            return None
        return Principal(BOOTSTRAP_ADMIN_ID, gw.settings.default_project, "admin")
    with gw.factory() as db:
        row = db.get(ApiKeyRow, key_id)
        if row is None or row.revoked_at is not None or row.kind != "admin":
            return None
        return Principal(row.id, row.project_id, "admin")


async def cookie_ctx(request: Request) -> Ctx | None:
    payload = unsign(signing_secret(request), request.cookies.get(COOKIE))
    if payload is None:
        return None
    p = await asyncio.to_thread(_still_valid, request, payload)
    return Ctx(p, str(payload["c"])) if p else None


async def api_ctx(request: Request, *, post: bool = False) -> Ctx:
    """Cookie (plus X-CSRF-Token on POST) or an admin bearer key; 401 / 403 otherwise."""
    secret = presented_secret(request)
    if secret:
        p = await asyncio.to_thread(gw_of(request).auth.resolve, secret)
        if p.kind != "admin":
            raise APIError(403, f"the admin API needs an admin key, not a {p.kind} key")
        return Ctx(p, None)
    ctx = await cookie_ctx(request)
    if ctx is None:
        raise APIError(401, "log in at /admin/login or send 'Authorization: Bearer <admin key>'")
    if post and not csrf_ok(request.headers.get("x-csrf-token", ""), ctx.csrf):
        raise APIError(403, "missing or wrong X-CSRF-Token header")
    return ctx
