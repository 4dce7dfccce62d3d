"""The dashboard's JSON API under ``/admin/api``.

Callers authenticate with the session cookie (POST / PATCH then need ``X-CSRF-Token``) or
with ``Authorization: Bearer <admin key>``. Errors are the gateway's error JSON; an
:class:`ActionError` from an action becomes one with the same status and message.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from core.errors import APIError
from gateway.admin import actions, queries
from gateway.admin.actions import ActionError
from gateway.admin.auth import Ctx, api_ctx, project_for
from gateway.admin.ops import act, db, decoder, recording_status
from gateway.admin.params import LISTS, int_param, list_page, paging, q
from gateway.routes.request_context import gw_of, read_json

router = APIRouter(include_in_schema=False)

P = ParamSpec("P")
R = TypeVar("R")


def action_errors(route: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Answer an ActionError raised by the route as the gateway's JSON error."""

    @functools.wraps(route)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await route(*args, **kwargs)
        except ActionError as e:
            raise APIError(e.status, e.message) from None

    return wrapper


async def _json_body(request: Request) -> dict[str, Any]:
    """The JSON object sent, checked as the client APIs' bodies are (gateway.routes.request_context
    ``read_json``: a 400 for nesting past the limit, a NUL or a lone surrogate)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    body = await read_json(request)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


# ---- reading ------------------------------------------------------------------------


def _list_route(name: str) -> None:
    """``GET /admin/api/<name>``: one page of a dashboard list (params.py ``LISTS``)."""

    async def route(request: Request) -> JSONResponse:
        ctx = await api_ctx(request)
        return JSONResponse((await list_page(request, name, ctx.scope)).as_json())

    route.__name__ = f"api_{name}"
    router.add_api_route(f"/admin/api/{name}", route, methods=["GET"])


for _name in LISTS:
    _list_route(_name)


@router.get("/admin/api/overview")
async def api_overview(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    hours = int_param(request, "hours", 24, 1, 24 * 14)
    ov = await db(request, queries.overview, ctx.scope, hours)
    ov["recording"] = recording_status(request)
    return JSONResponse(queries.jsonable(ov))


@router.get("/admin/api/sessions/{session_id}")
async def api_session(session_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    decode = decoder(request) if request.query_params.get("tokens") in ("1", "true") else None
    detail = await db(request, queries.session_detail, ctx.scope, session_id, decode)
    if detail is None:
        raise APIError(404, f"no session {session_id}")
    return JSONResponse(queries.jsonable(detail))


@router.get("/admin/api/runs/{run_id}")
async def api_run(run_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    run = await db(request, queries.run_detail, ctx.scope, run_id, **paging(request))
    if run is None:
        raise APIError(404, f"no run {run_id}")
    run["samples"] = run["samples"].as_json()
    return JSONResponse(queries.jsonable(run))


@router.get("/admin/api/adapters")
async def api_adapters(request: Request) -> JSONResponse:
    ctx = await api_ctx(request)
    items = await db(request, queries.adapters, ctx.scope, project=q(request, "project"))
    return JSONResponse({"items": queries.jsonable(items)})


# ---- acting -------------------------------------------------------------------------


@router.post("/admin/api/keys")
@action_errors
async def api_key_create(request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    pid = project_for(ctx, body.get("project_id"))
    kind, name = str(body.get("kind", "agent")), body.get("name")
    factory = gw_of(request).factory
    created = await asyncio.to_thread(actions.new_key, factory, pid, kind, name, ctx.actor)
    return JSONResponse(created, status_code=201)


@router.post("/admin/api/keys/{key_id}/revoke")
@action_errors
async def api_key_revoke(key_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    gw = gw_of(request)
    out = await asyncio.to_thread(actions.drop_key, gw.factory, key_id, ctx.actor, ctx.scope)
    gw.auth.forget()
    return JSONResponse(out)


async def _project_call(
    request: Request, project_id: str, fn: Callable[..., Any], *args: Any, ctx: Ctx | None = None
) -> Any:
    """``fn(factory, project, *args)`` in a worker thread, for a project the caller may see
    (``ctx``: the caller, when the route already checked it); a LookupError is a 404."""
    ctx = ctx or await api_ctx(request)
    pid = project_for(ctx, project_id)
    try:
        return await asyncio.to_thread(fn, gw_of(request).factory, pid, *args)
    except LookupError as e:
        raise APIError(404, str(e)) from None


@router.get("/admin/api/projects/{project_id}/training")
@action_errors
async def api_training_get(project_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _project_call(request, project_id, actions.training_settings))


@router.patch("/admin/api/projects/{project_id}/training")
@action_errors
async def api_training_patch(project_id: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    update = actions.update_training_settings
    return JSONResponse(await _project_call(request, project_id, update, body, ctx.actor, ctx=ctx))


@router.get("/admin/api/projects/{project_id}/feedback")
@action_errors
async def api_feedback_get(project_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _project_call(request, project_id, actions.feedback_settings))


@router.put("/admin/api/projects/{project_id}/feedback")
@action_errors
async def api_feedback_put(project_id: str, request: Request) -> JSONResponse:
    """Body ``{"agent_keys_rate": false}``: the project's agent keys may not rate."""
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    update = actions.update_feedback_settings
    return JSONResponse(await _project_call(request, project_id, update, body, ctx.actor, ctx=ctx))


@router.post("/admin/api/actions/{action}")
@action_errors
async def api_action(action: str, request: Request) -> JSONResponse:
    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    target = body.get("target")
    target = str(target) if target is not None else None
    out = await act(request, ctx, action, body.get("project_id"), target)
    return JSONResponse(out, status_code=202 if action == "train-now" else 200)


@router.get("/admin/api/unloads")
async def api_unloads(request: Request) -> JSONResponse:
    """The background unloads of replaced versions still pending on this gateway: what
    each waits for (``in_flight`` requests) and when it unloads anyway
    (gateway/engines/unloads.py)."""
    ctx = await api_ctx(request)
    unloads = gw_of(request).unloads
    return JSONResponse({"items": unloads.pending(ctx.scope) if unloads is not None else []})


# ---- verifiers and the judge (logic and checks: trainer/api.py) -----------------------


@router.get("/admin/api/projects/{project_id}/verifiers")
@action_errors
async def api_verifiers_get(project_id: str, request: Request) -> JSONResponse:
    from trainer import api as trainer_api

    out = await _project_call(request, project_id, trainer_api.verifier_settings)
    return JSONResponse(queries.jsonable(out))


@router.put("/admin/api/projects/{project_id}/verifiers")
@action_errors
async def api_verifiers_put(project_id: str, request: Request) -> JSONResponse:
    """Body ``{"verifiers": [...]}`` (null removes them); a bad spec is a 400 saying what
    to fix, and nothing changes."""
    from trainer import api as trainer_api

    ctx = await api_ctx(request, post=True)
    body = await _json_body(request)
    if set(body) != {"verifiers"}:
        raise APIError(400, 'the body must be {"verifiers": [...]} (null removes them)')
    update = trainer_api.update_verifiers
    try:
        out = await _project_call(
            request, project_id, update, body["verifiers"], ctx.actor, ctx=ctx
        )
    except (TypeError, ValueError) as e:  # VerifierSpecError is a ValueError
        raise APIError(400, f"verifiers not changed: {e}") from None
    return JSONResponse(queries.jsonable(out))


@router.get("/admin/api/sessions/{session_id}/credit")
async def api_session_credit(session_id: str, request: Request) -> JSONResponse:
    """Each turn's reward, the level that decided it and the ratings behind it (origin:
    user, verifier, judge, next_turn, next_turn_rules, system; a judge's rationale and
    model)."""
    from trainer import api as trainer_api

    ctx = await api_ctx(request)
    out = await asyncio.to_thread(trainer_api.session_credit, gw_of(request).factory, session_id)
    if out is None or (ctx.scope is not None and out["project_id"] not in ctx.scope):
        raise APIError(404, f"no session {session_id}")
    return JSONResponse(queries.jsonable(out))


@router.get("/admin/api/projects/{project_id}/learning-curve")
@action_errors
async def api_learning_curve(project_id: str, request: Request) -> JSONResponse:
    """Per policy version: requests, rated interactions, mean reward, eval gate score."""
    from trainer import api as trainer_api

    ctx = await api_ctx(request)
    items = await _project_call(request, project_id, trainer_api.learning_curve, ctx=ctx)
    return JSONResponse(
        {"project_id": project_for(ctx, project_id), "items": queries.jsonable(items)}
    )
