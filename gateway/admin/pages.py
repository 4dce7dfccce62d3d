"""The dashboard's HTML routes: login / logout, the pages, and their POSTed forms.

Pages need the session cookie (else a redirect to ``/admin/login``); every form carries
the session's CSRF token in a hidden ``csrf`` field (403 otherwise), the login form its
own pre-login token. Forms answer with a 303 back to the page, ``?msg=`` or ``?err=``.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
import urllib.parse
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from core.errors import APIError
from gateway import admin_actions as actions
from gateway.admin import charts, queries
from gateway.admin.auth import (
    COOKIE,
    PRE_COOKIE,
    SESSION_TTL_S,
    Ctx,
    cookie_ctx,
    csrf_ok,
    project_for,
    secure,
    sign,
    signing_secret,
    unsign,
)
from gateway.admin.ops import db, decoder, do_action, recording_status
from gateway.admin.params import (
    feedback_filters,
    key_filters,
    paging,
    q,
    run_filters,
    session_filters,
)
from gateway.admin.render import HERE, html, render
from gateway.admin_actions import ActionError
from gateway.ratelimit import limiter_for, settings_of
from gateway.routing import gw_of

router = APIRouter(include_in_schema=False)

RUN_LIVE = ("queued", "running")


# ---- session and forms --------------------------------------------------------------


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        "/admin/login?" + urllib.parse.urlencode({"next": target}), status_code=303
    )


async def page_ctx(request: Request) -> Ctx | Response:
    ctx = await cookie_ctx(request)
    return ctx if ctx is not None else _to_login(request)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the dashboard's forms), parsed without python-multipart."""
    raw = await request.body()
    if len(raw) > 64 * 1024:
        raise APIError(413, "form too large")
    try:
        pairs = urllib.parse.parse_qsl(raw.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        raise APIError(400, "the form is not valid UTF-8") from None
    return dict(pairs)


async def form_ctx(request: Request) -> tuple[Ctx, dict[str, str]] | Response:
    """A POSTed dashboard form: logged-in session and a matching CSRF token."""
    ctx = await cookie_ctx(request)
    if ctx is None:
        return _to_login(request)
    form = await read_form(request)
    if not csrf_ok(form.get("csrf", ""), ctx.csrf):
        return HTMLResponse(
            render(request, "error.html", None, message="CSRF token missing or wrong"), 403
        )
    return ctx, form


def _safe_next(target: str | None) -> str:
    if target and target.startswith("/admin") and not target.startswith("//"):
        return target
    return "/admin"


def _back(form: dict[str, str], default: str, **query: str) -> RedirectResponse:
    target = _safe_next(form.get("next") or default)
    sep = "&" if "?" in target else "?"
    return RedirectResponse(target + sep + urllib.parse.urlencode(query), status_code=303)


def _run_charts(run: dict[str, Any]) -> list[str]:
    steps = [str(s.get("step", i)) for i, s in enumerate(run["step_metrics"])]
    return [
        charts.line_chart(
            label, {key: run["series"][key]}, x_labels=steps or None, chart_id=f"chart-{key}"
        )
        for key, label in queries.STEP_METRICS
    ]


def _overview_charts(ov: dict[str, Any]) -> list[str]:
    s = ov["series"]
    return [
        charts.line_chart(
            "requests per hour",
            {"requests": s["requests"]},
            x_labels=s["labels"],
            chart_id="chart-requests",
        ),
        charts.line_chart(
            "mean reward (rated interactions)",
            {"mean reward": s["mean_reward"]},
            x_labels=s["labels"],
            chart_id="chart-reward",
        ),
        charts.line_chart(
            "feedback rate (rated / all)",
            {"rate": s["feedback_rate"]},
            x_labels=s["labels"],
            chart_id="chart-feedback-rate",
        ),
    ]


# ---- login / logout -----------------------------------------------------------------


@router.get("/admin/login")
async def login_page(request: Request) -> Response:
    token = secrets.token_urlsafe(24)
    secret = signing_secret(request)
    resp = html(render(request, "login.html", None, pre=token, next=_safe_next(q(request, "next"))))
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
    nxt = _safe_next(form.get("next"))

    async def fail(message: str, status: int) -> Response:
        if status in (401, 403):  # a guessed key: spend one of this IP's attempts
            await login_limited(request, take=True)
        return html(
            render(request, "login.html", None, pre=pre["t"], next=nxt, error=message), status
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


# ---- pages --------------------------------------------------------------------------


@router.get("/admin")
@router.get("/admin/")
async def overview_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    ov = await db(request, queries.overview, ctx.scope)
    ov["recording"] = recording_status(request)
    return html(render(request, "overview.html", ctx, ov=ov, charts=_overview_charts(ov)))


@router.get("/admin/sessions")
async def sessions_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    f = session_filters(request)
    page = await db(request, queries.sessions, ctx.scope, **f, **paging(request))
    projects = await db(request, queries.projects, ctx.scope)
    agents = await db(request, queries.agents, ctx.scope)
    return html(
        render(
            request,
            "sessions.html",
            ctx,
            page=page,
            projects=projects,
            agents=agents,
            f=request.query_params,
        )
    )


@router.get("/admin/sessions/{session_id}")
async def session_page(session_id: str, request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    detail = await db(request, queries.session_detail, ctx.scope, session_id, decoder(request))
    if detail is None:
        return html(render(request, "error.html", ctx, message=f"no session {session_id}"), 404)
    return html(render(request, "session.html", ctx, d=detail))


@router.get("/admin/feedback")
async def feedback_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    page = await db(
        request, queries.feedback, ctx.scope, **feedback_filters(request), **paging(request)
    )
    projects = await db(request, queries.projects, ctx.scope)
    return html(
        render(request, "feedback.html", ctx, page=page, projects=projects, f=request.query_params)
    )


@router.get("/admin/runs")
async def runs_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    page = await db(request, queries.runs, ctx.scope, **run_filters(request), **paging(request))
    ov = await db(request, queries.overview, ctx.scope, 1)
    return html(
        render(
            request, "runs.html", ctx, page=page, projects=ov["projects"], f=request.query_params
        )
    )


@router.get("/admin/runs/{run_id}")
async def run_page(run_id: str, request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    run = await db(request, queries.run_detail, ctx.scope, run_id, **paging(request))
    if run is None:
        return html(render(request, "error.html", ctx, message=f"no run {run_id}"), 404)
    return html(
        render(
            request,
            "run.html",
            ctx,
            run=run,
            charts=_run_charts(run),
            live=run["status"] in RUN_LIVE,
        )
    )


@router.get("/admin/adapters")
async def adapters_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    items = await db(request, queries.adapters, ctx.scope, project=q(request, "project"))
    projects = await db(request, queries.projects, ctx.scope)
    return html(
        render(
            request, "adapters.html", ctx, items=items, projects=projects, f=request.query_params
        )
    )


async def _keys_html(
    request: Request, ctx: Ctx, created: dict[str, Any] | None = None, status: int = 200
) -> Response:
    page = await db(request, queries.keys, ctx.scope, **key_filters(request), **paging(request))
    projects = await db(request, queries.projects, ctx.scope)
    return html(
        render(
            request,
            "keys.html",
            ctx,
            page=page,
            projects=projects,
            created=created,
            f=request.query_params,
        ),
        status,
    )


@router.get("/admin/keys")
async def keys_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    return await _keys_html(request, ctx)


# ---- forms --------------------------------------------------------------------------


@router.post("/admin/actions/{action}")
async def action_form(action: str, request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    ctx, form = got
    try:
        result = await asyncio.to_thread(
            do_action, request, ctx, action, form.get("project_id"), form.get("target")
        )
    except ActionError as e:
        return _back(form, "/admin", err=e.message)
    if action == "train-now":
        return RedirectResponse(
            "/admin/runs/" + urllib.parse.quote(result["run_id"]) + "?msg=run+queued",
            status_code=303,
        )
    text = {
        "pause": "training paused",
        "resume": "training resumed",
        "retire": f"{result.get('name')} retired",
    }.get(action, f"{result.get('name')} is serving")
    return _back(form, "/admin", msg=text)


@router.post("/admin/keys")
async def key_create_form(request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    ctx, form = got
    gw = gw_of(request)
    try:
        pid = project_for(ctx, form.get("project_id"))
        created = await asyncio.to_thread(
            actions.new_key,
            gw.factory,
            pid,
            form.get("kind", "agent"),
            form.get("name"),
            ctx.actor,
        )
    except ActionError as e:
        return _back(form, "/admin/keys", err=e.message)
    return await _keys_html(request, ctx, created, 201)


@router.post("/admin/keys/{key_id}/revoke")
async def key_revoke_form(key_id: str, request: Request) -> Response:
    got = await form_ctx(request)
    if isinstance(got, Response):
        return got
    ctx, form = got
    gw = gw_of(request)
    try:
        await asyncio.to_thread(actions.drop_key, gw.factory, key_id, ctx.actor, ctx.scope)
    except ActionError as e:
        return _back(form, "/admin/keys", err=e.message)
    gw.auth.forget()
    return _back(form, "/admin/keys", msg=f"key {key_id} revoked")
