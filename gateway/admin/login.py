"""The dashboard's login and logout, and its static files.

Login takes an admin key in a form carrying the pre-login CSRF token and sets the signed
session cookie; failed attempts are rate limited per client IP.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from core.errors import APIError
from core.keys import up_keys_path
from gateway.admin.auth import (
    COOKIE,
    PRE_COOKIE,
    SESSION_TTL_S,
    csrf_ok,
    secure,
    sign,
    signing_secret,
    unsign,
)
from gateway.admin.forms import form_ctx, read_form, safe_next
from gateway.admin.params import q
from gateway.admin.render import HERE, html, render
from gateway.edge.ratelimit import limiter_for, settings_of
from gateway.routes.request_context import gw_of

router = APIRouter(include_in_schema=False)


def _up_keys(request: Request) -> str:
    """Where `rlgate up` keeps the admin key it printed, for this gateway's data directory
    (``./rlgate-data/up-keys.json`` by default), as the login page names it."""
    path = up_keys_path(gw_of(request).settings.data_dir)
    return str(path) if path.is_absolute() else f"./{path}"


@router.get("/admin/login")
async def login_page(request: Request) -> Response:
    token = secrets.token_urlsafe(24)
    secret = signing_secret(request)
    resp = html(
        render(
            request,
            "login.html",
            None,
            pre=token,
            next=safe_next(q(request, "next")),
            up_keys=_up_keys(request),
        )
    )
    resp.set_cookie(
        PRE_COOKIE,
        sign(secret, {"t": token, "exp": time.time() + 3600}),
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=secure(request),
        path="/admin",
    )
    return resp


@router.post("/admin/login")
async def login(request: Request) -> Response:
    """Check an admin key and set the session cookie. Failed attempts (a wrong or
    non-admin key) are rate limited per client IP (``RLGATE_LOGIN_RATE_PER_MIN``, default
    10 a minute): past it every attempt is a 429 with Retry-After, right key or not."""
    limited = await login_limited(request)
    if limited is not None:
        return limited
    form = await read_form(request)
    secret = signing_secret(request)
    pre = unsign(secret, request.cookies.get(PRE_COOKIE))
    if pre is None or not csrf_ok(form.get("csrf", ""), str(pre.get("t", ""))):
        return html(render(request, "error.html", None, message="CSRF token missing or wrong"), 403)
    nxt = safe_next(form.get("next"))

    async def fail(message: str, status: int) -> Response:
        if status in (401, 403):  # a guessed key: spend one of this IP's attempts
            await login_limited(request, take=True)
        return html(
            render(
                request,
                "login.html",
                None,
                pre=pre["t"],
                next=nxt,
                error=message,
                up_keys=_up_keys(request),
            ),
            status,
        )

    key = form.get("key", "").strip()
    if not key:
        return await fail("enter an admin key", 400)
    try:
        p = await asyncio.to_thread(gw_of(request).auth.resolve, key)
    except APIError:
        return await fail("unknown or revoked key", 401)
    if p.kind != "admin":
        return await fail(f"this is a {p.kind} key; the dashboard needs an admin key", 403)
    payload = {"k": p.key_id, "c": secrets.token_urlsafe(24), "exp": time.time() + SESSION_TTL_S}
    resp = RedirectResponse(nxt, status_code=303)
    resp.set_cookie(
        COOKIE,
        sign(secret, payload),
        max_age=SESSION_TTL_S,
        httponly=True,
        samesite="strict",
        secure=secure(request),
        path="/admin",
    )
    resp.delete_cookie(PRE_COOKIE, path="/admin")
    return resp


async def login_limited(request: Request, take: bool = False) -> Response | None:
    """The 429 page when this client IP has used its failed login attempts, else None.
    ``take``: count one failed attempt."""
    per_min = settings_of(request.app).login_rate_per_min
    ip = request.client.host if request.client else "unknown"
    limiter = limiter_for(request.app)
    wait = await limiter.take("login:" + ip, per_min / 60.0, per_min, peek=not take)
    if wait <= 0 or take:
        return None
    seconds = max(1, math.ceil(wait))
    message = f"too many login attempts from this address; try again in {seconds} s"
    resp = html(render(request, "error.html", None, message=message), 429)
    resp.headers["Retry-After"] = str(seconds)
    return resp


@router.post("/admin/logout")
async def logout(request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    resp = RedirectResponse("/admin/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/admin")
    return resp


@router.get("/admin/static/{name}")
async def static(name: str) -> Response:
    path = HERE / "static" / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise APIError(404, "not found")
    kind = {"js": "text/javascript", "css": "text/css"}.get(path.suffix[1:], "text/plain")
    return Response(path.read_bytes(), media_type=kind, headers={"Cache-Control": "max-age=300"})
