"""The dashboard's HTML routes: the pages and their POSTed forms (login / logout and the
static files are in ``login.py``, included here).

Pages need the session cookie (else a redirect to ``/admin/login``); every form carries
the session's CSRF token in a hidden ``csrf`` field (403 otherwise), the login form its
own pre-login token (``forms.py``). Forms answer with a 303 back to the page, ``?msg=``
or ``?err=``.
"""

from __future__ import annotations

import asyncio
import inspect
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from core.serving_version import is_base
from gateway.admin import actions, charts, learning, login, queries
from gateway.admin.actions import ActionError
from gateway.admin.auth import Ctx, project_for
from gateway.admin.forms import back, form_ctx, page_ctx
from gateway.admin.ops import act, db, decoder, recording_status
from gateway.admin.params import list_page, paging, q
from gateway.admin.render import html, render
from gateway.routes.request_context import gw_of
from schemas.atdp import RunStatus

router = APIRouter(include_in_schema=False)
router.include_router(login.router)  # first, as before the split

RUN_LIVE = (RunStatus.queued, RunStatus.running)


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


# ---- pages --------------------------------------------------------------------------


PageFn = Callable[..., Awaitable[Response]]


def _guarded(method: str, paths: tuple[str, ...], check: Callable[[Request], Any]) -> Any:
    """Register ``fn(request, <what check gives>, **path params)`` at ``paths``: ``check``
    answers a Response (the login page, a CSRF refusal) or what ``fn`` takes after
    ``request``. FastAPI reads ``fn``'s signature less those parameters."""

    def register(fn: PageFn) -> PageFn:
        async def route(request: Request, **params: Any) -> Response:
            got = await check(request)
            if isinstance(got, Response):
                return got
            return await fn(request, *(got if isinstance(got, tuple) else (got,)), **params)

        sig = inspect.signature(fn)
        route.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[x for x in sig.parameters.values() if x.name not in ("ctx", "form")]
        )
        route.__name__ = fn.__name__
        for path in paths:
            router.add_api_route(path, route, methods=[method])
        return fn

    return register


def page(*paths: str) -> Callable[[PageFn], PageFn]:
    """A dashboard page: ``fn(request, ctx, **path params)`` for a logged-in admin; anyone
    else is sent to the login page."""
    return _guarded("GET", paths, page_ctx)


def form_post(path: str) -> Callable[[PageFn], PageFn]:
    """A dashboard form: ``fn(request, ctx, form, **path params)`` for a logged-in admin
    whose form carries the session's CSRF token."""
    return _guarded("POST", (path,), form_ctx)


@page("/admin", "/admin/")
async def overview_page(request: Request, ctx: Ctx) -> Response:
    ov = await db(request, queries.overview, ctx.scope)
    ov["recording"] = recording_status(request)
    pids = [p["id"] for p in ov["projects"]]
    learned = await asyncio.to_thread(learning.project_learning, gw_of(request).factory, pids)
    return html(
        render(
            request,
            "overview.html",
            ctx,
            ov=ov,
            charts=_overview_charts(ov),
            learning=learned,
        )
    )


async def _list_html(
    request: Request, ctx: Ctx, name: str, status: int = 200, **extra: Any
) -> Response:
    """The page of a dashboard list (params.py ``LISTS``), ``<name>.html``, with the
    projects to filter by (unless ``extra`` brings its own) and the filters as sent."""
    page = await list_page(request, name, ctx.scope)
    if "projects" not in extra:
        extra["projects"] = await db(request, queries.projects, ctx.scope)
    template = f"{name}.html"
    return html(render(request, template, ctx, page=page, f=request.query_params, **extra), status)


@page("/admin/sessions")
async def sessions_page(request: Request, ctx: Ctx) -> Response:
    agents = await db(request, queries.agents, ctx.scope)
    return await _list_html(request, ctx, "sessions", agents=agents)


@page("/admin/sessions/{session_id}")
async def session_page(request: Request, ctx: Ctx, session_id: str) -> Response:
    detail = await db(request, queries.session_detail, ctx.scope, session_id, decoder(request))
    if detail is None:
        return html(render(request, "error.html", ctx, message=f"no session {session_id}"), 404)
    # the credit route's data (trainer.api.session_credit); scope was checked just above
    credit = await asyncio.to_thread(learning.session_credit, gw_of(request).factory, session_id)
    return html(render(request, "session.html", ctx, d=detail, credit=credit))


@page("/admin/feedback")
async def feedback_page(request: Request, ctx: Ctx) -> Response:
    return await _list_html(request, ctx, "feedback")


@page("/admin/runs")
async def runs_page(request: Request, ctx: Ctx) -> Response:
    ov = await db(request, queries.overview, ctx.scope, 1)
    return await _list_html(request, ctx, "runs", projects=ov["projects"])


@page("/admin/runs/{run_id}")
async def run_page(request: Request, ctx: Ctx, run_id: str) -> Response:
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


@page("/admin/adapters")
async def adapters_page(request: Request, ctx: Ctx) -> Response:
    items = await db(request, queries.adapters, ctx.scope, project=q(request, "project"))
    projects = await db(request, queries.projects, ctx.scope)
    unloads = gw_of(request).unloads
    return html(
        render(
            request,
            "adapters.html",
            ctx,
            items=items,
            projects=projects,
            f=request.query_params,
            unloads=unloads.pending(ctx.scope) if unloads is not None else [],
        )
    )


async def _keys_html(
    request: Request, ctx: Ctx, created: dict[str, Any] | None = None, status: int = 200
) -> Response:
    return await _list_html(request, ctx, "keys", status, created=created)


@page("/admin/keys")
async def keys_page(request: Request, ctx: Ctx) -> Response:
    return await _keys_html(request, ctx)


# ---- forms --------------------------------------------------------------------------


@form_post("/admin/actions/{action}")
async def action_form(request: Request, ctx: Ctx, form: dict[str, str], action: str) -> Response:
    try:
        result = await act(request, ctx, action, form.get("project_id"), form.get("target"))
    except ActionError as e:
        return back(form, "/admin", err=e.message)
    if action == "train-now":
        return RedirectResponse(
            "/admin/runs/" + urllib.parse.quote(result["run_id"]) + "?msg=run+queued",
            status_code=303,
        )
    text = {
        "pause": "training paused",
        "resume": "training resumed",
        "retire": f"{result.get('name')} retired",
    }.get(action, _serving_text(result))
    return back(form, "/admin", msg=text)


def _serving_text(result: dict[str, Any]) -> str:
    name = result.get("name")
    what = "the base model" if is_base(name) else name
    if not result.get("changed", True):
        return f"{what} already serves"
    unload = result.get("unload")
    if not unload:
        return f"{what} is serving"
    if not unload["in_flight"]:
        return f"{what} is serving; {unload['name']} is being unloaded from the engines"
    return (
        f"{what} is serving; {unload['name']} is unloaded from the engines when the "
        f"{unload['in_flight']} request(s) still on it are done (Adapters: Unloading)"
    )


@form_post("/admin/keys")
async def key_create_form(request: Request, ctx: Ctx, form: dict[str, str]) -> Response:
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
        return back(form, "/admin/keys", err=e.message)
    return await _keys_html(request, ctx, created, 201)


@form_post("/admin/keys/{key_id}/revoke")
async def key_revoke_form(
    request: Request, ctx: Ctx, form: dict[str, str], key_id: str
) -> Response:
    gw = gw_of(request)
    try:
        await asyncio.to_thread(actions.drop_key, gw.factory, key_id, ctx.actor, ctx.scope)
    except ActionError as e:
        return back(form, "/admin/keys", err=e.message)
    gw.auth.forget()
    return back(form, "/admin/keys", msg=f"key {key_id} revoked")
