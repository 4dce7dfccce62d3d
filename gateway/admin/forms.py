"""The dashboard's session and forms: a page needs the session cookie (else a redirect to
``/admin/login``), a POSTed form also the session's CSRF token (403 otherwise); forms
answer with a 303 back to a page under ``/admin``."""

from __future__ import annotations

import urllib.parse

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from core.errors import APIError
from gateway.admin.auth import Ctx, cookie_ctx, csrf_ok
from gateway.admin.render import render
from gateway.edge.boundary import pairs_error


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        "/admin/login?" + urllib.parse.urlencode({"next": target}), status_code=303
    )


async def page_ctx(request: Request) -> Ctx | Response:
    ctx = await cookie_ctx(request)
    return ctx if ctx is not None else to_login(request)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the dashboard's forms), parsed without python-multipart."""
    raw = await request.body()
    if len(raw) > 64 * 1024:
        raise APIError(413, "form too large")
    try:
        pairs = urllib.parse.parse_qsl(raw.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        raise APIError(400, "the form is not valid UTF-8") from None
    err = pairs_error(pairs, "form field")  # a NUL cannot be stored (gateway.edge.boundary)
    if err is not None:
        raise err
    return dict(pairs)


async def form_ctx(request: Request) -> tuple[Ctx, dict[str, str]] | Response:
    """A POSTed dashboard form: logged-in session and a matching CSRF token."""
    ctx = await cookie_ctx(request)
    if ctx is None:
        return to_login(request)
    form = await read_form(request)
    if not csrf_ok(form.get("csrf", ""), ctx.csrf):
        return HTMLResponse(
            render(request, "error.html", None, message="CSRF token missing or wrong"), 403
        )
    return ctx, form


def safe_next(target: str | None) -> str:
    if target and target.startswith("/admin") and not target.startswith("//"):
        return target
    return "/admin"


def back(form: dict[str, str], default: str, **query: str) -> RedirectResponse:
    target = safe_next(form.get("next") or default)
    sep = "&" if "?" in target else "?"
    return RedirectResponse(target + sep + urllib.parse.urlencode(query), status_code=303)
