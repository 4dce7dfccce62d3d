"""The dashboard's HTML routes: the pages and their POSTed forms (login / logout and the
static files are in ``login.py``, included here).

Pages need the session cookie (else a redirect to ``/admin/login``); every form carries
the session's CSRF token in a hidden ``csrf`` field (403 otherwise), the login form its
own pre-login token (``forms.py``). Forms answer with a 303 back to the page, ``?msg=``
or ``?err=``.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from gateway import admin_actions as actions
from gateway.admin import charts, learning, login, queries
from gateway.admin.auth import Ctx, project_for
from gateway.admin.forms import back, form_ctx, page_ctx
from gateway.admin.ops import db, decoder, do_action, recording_status
from gateway.admin.params import list_page, paging, q
from gateway.admin.render import html, render
from gateway.admin_actions import ActionError
from gateway.request_context import gw_of
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


@router.get("/admin")
@router.get("/admin/")
async def overview_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
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


@router.get("/admin/sessions")
async def sessions_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    agents = await db(request, queries.agents, ctx.scope)
    return await _list_html(request, ctx, "sessions", agents=agents)


@router.get("/admin/sessions/{session_id}")
async def session_page(session_id: str, request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    detail = await db(request, queries.session_detail, ctx.scope, session_id, decoder(request))
    if detail is None:
        return html(render(request, "error.html", ctx, message=f"no session {session_id}"), 404)
    # the credit route's data (trainer.api.session_credit); scope was checked just above
    credit = await asyncio.to_thread(learning.session_credit, gw_of(request).factory, session_id)
    return html(render(request, "session.html", ctx, d=detail, credit=credit))


@router.get("/admin/feedback")
async def feedback_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    return await _list_html(request, ctx, "feedback")


@router.get("/admin/runs")
async def runs_page(request: Request) -> Response:
    ctx = await page_ctx(request)
    if isinstance(ctx, Response):
        return ctx
    ov = await db(request, queries.overview, ctx.scope, 1)
    return await _list_html(request, ctx, "runs", projects=ov["projects"])


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
    return await _list_html(request, ctx, "keys", status, created=created)


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
    }.get(action, f"{result.get('name')} is serving")
    return back(form, "/admin", msg=text)


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
        return back(form, "/admin/keys", err=e.message)
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
        return back(form, "/admin/keys", err=e.message)
    gw.auth.forget()
    return back(form, "/admin/keys", msg=f"key {key_id} revoked")
