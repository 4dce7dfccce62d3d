"""Work the pages and the JSON API share: queries in a thread, the token decoder, actions."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from gateway.admin import actions
from gateway.admin.actions import ActionError
from gateway.admin.auth import Ctx, project_for
from gateway.routes.request_context import gw_of

ACTIONS = ("train-now", "pause", "resume", "promote", "rollback", "retire")


async def db(request: Request, fn: Any, *args: Any, **kw: Any) -> Any:
    """``fn(session, *args, **kw)`` on a database session, in a worker thread."""
    gw = gw_of(request)

    def work() -> Any:
        with gw.factory() as session:
            return fn(session, *args, **kw)

    return await asyncio.to_thread(work)


def recording_status(request: Request) -> dict[str, Any]:
    """This gateway's recording figures: records waiting for the database, its lag, and
    the records the database refused (kept in the dead-letter file)."""
    rec = gw_of(request).recorder
    return {
        "pending": rec.pending,
        "lag_s": round(rec.lag_seconds, 1),
        "dead_letters": rec.dead_letters.count,
        "dead_letter_file": str(rec.dead_letters.path),
    }


def decoder(request: Request) -> Any:
    """The policy tokenizer's ``decode``, or None when the gateway has no tokenizer."""
    tok = getattr(gw_of(request), "tokenizer", None)
    return tok.decode if tok is not None else None


async def act(
    request: Request, ctx: Ctx, action: str, project: str | None, target: str | None
) -> dict[str, Any]:
    """An action, answered as soon as it took effect: a rollback or promote returns once
    new requests go to the new version (this gateway's cached pointer dropped here, the
    others' by core/serving_events.py or their cache's expiry); the replaced version is
    unloaded in the background (gateway/engines/unloads.py), its progress in ``"unload"``."""
    out = await asyncio.to_thread(do_action, request, ctx, action, project, target)
    unloading = out.pop("unloading", None)
    if action in ("promote", "rollback") and out.get("changed"):
        gw = gw_of(request)
        pid = project_for(ctx, project)
        gw.pipeline.serving.forget(pid)
        if unloading and gw.unloads is not None:
            out["unload"] = gw.unloads.start(pid, unloading, ctx.actor)
    return out


def do_action(
    request: Request, ctx: Ctx, action: str, project: str | None, target: str | None
) -> dict[str, Any]:
    """Blocking; run in a thread (:func:`act` does)."""
    gw = gw_of(request)
    if action not in ACTIONS:
        raise ActionError(404, f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    pid = project_for(ctx, project)
    if action == "train-now":
        return actions.train_now(gw.factory, pid, ctx.actor)
    if action in ("pause", "resume"):
        return actions.set_paused(gw.factory, pid, action == "pause", ctx.actor)
    if action == "rollback":
        return actions.rollback(gw.factory, gw.settings, pid, ctx.actor, target or None)
    if not target:
        raise ActionError(400, f"{action} needs a target version (name, id or number)")
    if action == "promote":
        return actions.promote(gw.factory, gw.settings, pid, target, ctx.actor)
    return actions.retire(gw.factory, pid, target, ctx.actor)
