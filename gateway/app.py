"""The gateway FastAPI application: wiring and the OpenAI-compatible routes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.db import DB_DOWN, check_connection, make_engine, session_factory
from core.errors import APIError
from core.keys import create_key
from core.migrate import current
from core.settings import ConfigError, Settings, get_settings
from gateway import exposure, openai_chat
from gateway.auth import BOOTSTRAP_ADMIN_ID, Authenticator, require_kind
from gateway.engine_client import EngineClient
from gateway.errors import bad_request, db_down_error, error_response
from gateway.feedback import session_closed
from gateway.limits import BodyLimitMiddleware
from gateway.metrics import Metrics
from gateway.parsing import TOOL_PARSERS
from gateway.ratelimit import RateLimitMiddleware
from gateway.recorder import Recorder
from gateway.redaction import RedactionPolicy
from gateway.render_pool import RenderPool
from gateway.routing import gw_of, headers_for, principal, read_json
from gateway.service import Pipeline, ServingPolicy, open_stream
from gateway.sessions import SessionStore, new_session_id
from gateway.state import Gateway
from gateway.storable import bounded_str
from gateway.templating import ChatRenderer, load_tokenizer
from schemas.coltypes import utcnow
from schemas.tables import SessionRow

log = logging.getLogger("rlgate.gateway")


def _context_length(model_dir: Path) -> int:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 4096
    return int(cfg.get("max_position_embeddings") or 4096)


def _tokenizer_dir(settings: Settings) -> Path | str:
    if settings.tokenizer_path:
        return settings.tokenizer_path
    from engine.model_files import resolve_model_dir

    if settings.uses_packaged_model or Path(settings.model_path).is_dir():
        return resolve_model_dir(settings.model_path, settings.data_dir)
    return settings.model_path  # a hub id, for production deployments that can reach it


def build_gateway(settings: Settings) -> Gateway:
    if settings.tool_parser and settings.tool_parser not in TOOL_PARSERS:
        raise ConfigError(f"RLGATE_TOOL_PARSER must be one of {', '.join(TOOL_PARSERS)}")
    db_engine = make_engine(settings.effective_database_url)
    check_connection(db_engine)
    if current(settings.effective_database_url) is None:
        raise ConfigError("the database is not migrated yet; run `rlgate migrate` first")
    factory = session_factory(db_engine)
    tok_dir = _tokenizer_dir(settings)
    tokenizer = load_tokenizer(tok_dir)
    ctx = _context_length(Path(tok_dir)) if isinstance(tok_dir, Path) else 32768
    renderer = ChatRenderer(tokenizer, ctx)
    metrics = Metrics()
    engines = EngineClient(
        settings.engine_url_list,
        settings.max_in_flight_per_engine,
        settings.engine_timeout_s,
        api_key=settings.engine_api_key_value,
    )
    sessions = SessionStore(factory, settings.session_idle_timeout_s)
    recorder = Recorder(
        factory,
        settings.data_dir / "spool",
        fsync=settings.spool_fsync,
        on_sessions_written=sessions.committed,
        dead_letter_path=settings.data_dir / "dead_letters.jsonl",
        on_dead_letter=metrics.dead_letters.inc,
        backlog_max_bytes=int(settings.recording_backlog_max_mb * (1 << 20)),
        replay_interval_s=settings.spool_replay_interval_s,
        lag_alert_s=settings.recording_lag_alert_s,
    )
    pipeline = Pipeline(
        renderer=renderer,
        engines=engines,
        sessions=sessions,
        recorder=recorder,
        serving=ServingPolicy(factory, settings.serving_cache_s),
        metrics=metrics,
        tool_parser=settings.tool_parser or None,
        reasoning_parser=settings.reasoning_parser,
        default_max_tokens=settings.default_max_tokens,
        render_pool=RenderPool(settings.render_workers, settings.render_timeout_s),
        prompt_chars_per_token=settings.prompt_chars_per_token,
        redaction=RedactionPolicy(factory, settings.redact, settings.redact_patterns),
    )
    admin = settings.admin_key.get_secret_value() if settings.admin_key else None
    auth = Authenticator(factory, admin, settings.default_project, settings.session_key_grace_s)
    return Gateway(settings, factory, auth, pipeline, recorder, engines, metrics, tokenizer)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = build_gateway(settings)
        gw.recorder.start()
        app.state.gw = gw

        async def housekeeping() -> None:
            while True:
                await asyncio.sleep(30)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(gw.pipeline.sessions.expire_idle)

        task = asyncio.create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            await gw.engines.close()
            gw.pipeline.render_pool.close()
            await asyncio.to_thread(gw.recorder.stop)

    app = FastAPI(
        title="rlgate",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by exposure.install_openapi, behind an admin key
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RateLimitMiddleware)
    app.add_middleware(MetricsMiddleware)
    exposure.install_openapi(app)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions", include_in_schema=False)
    async def chat_completions(request: Request) -> Response:
        gw = gw_of(request)
        p = await principal(request)
        body = await read_json(request)
        req = openai_chat.to_internal(body, request.headers.get("x-session-id"))
        prep = await gw.pipeline.prepare(p, req, "chatcmpl-")
        model = gw.settings.served_model_name
        if req.stream:
            events, first = await open_stream(gw.pipeline, prep)
            return StreamingResponse(
                openai_chat.stream_body(gw.pipeline, prep, events, first, gw.tokenizer, model),
                media_type="text/event-stream",
                headers={**headers_for(prep), "Cache-Control": "no-cache"},
            )
        completions = await gw.pipeline.run(prep)
        await gw.pipeline.record(prep, completions)
        body_out = openai_chat.response_body(prep, completions, gw.tokenizer, model)
        return JSONResponse(body_out, headers=headers_for(prep))

    @app.get("/v1/models")
    @app.get("/models", include_in_schema=False)
    async def models(request: Request) -> dict[str, Any]:
        gw = gw_of(request)
        await principal(request)
        if "anthropic-version" in request.headers:  # Claude Code and the Anthropic SDK
            from gateway.anthropic_messages import models_body

            return models_body(gw.settings.served_model_name)
        return {
            "object": "list",
            "data": [
                {
                    "id": gw.settings.served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "rlgate",
                }
            ],
        }

    @app.get("/health")
    @exposure.admin_details
    async def health(request: Request) -> JSONResponse:
        gw = gw_of(request)
        engines = await gw.engines.health()
        ok = any(engines.values())
        # 503 when no call can succeed (no engine, recording backlog full); 200 otherwise,
        # "degraded" with reasons when recording lags or records were dead-lettered
        reasons = ([] if ok else ["no engine answers"]) + gw.recorder.problems()
        full = gw.recorder.backlog_bytes > gw.recorder.backlog_max_bytes
        return JSONResponse(
            {
                "status": "degraded" if reasons else "ok",
                "reasons": reasons,
                "engines": engines,
                "recording_pending": gw.recorder.pending,
                "recording_lag_s": round(gw.recorder.lag_seconds, 3),
                "dead_letters": gw.recorder.dead_letters.count,
            },
            status_code=200 if ok and not full else 503,
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        gw = gw_of(request)
        await exposure.require_admin(request, gw.settings.metrics_public)
        gw.metrics.recording_lag.set(gw.recorder.lag_seconds)
        gw.metrics.recording_pending.set(gw.recorder.pending)
        gw.metrics.recorded.set(gw.recorder.recorded_total)
        gw.metrics.dead_letters_kept.set(gw.recorder.dead_letters.count)
        gw.metrics.recording_backlog.set(gw.recorder.backlog_bytes)
        return Response(
            generate_latest(gw.metrics.registry), media_type="text/plain; version=0.0.4"
        )

    @app.post("/v1/sessions")
    async def create_session(request: Request) -> JSONResponse:
        gw = gw_of(request)
        p = await principal(request)
        require_kind(p, "agent", "admin")
        raw = await request.body()
        body = await read_json(request) if raw.strip() else {}
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        meta = body.get("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object", "metadata")
        fields = {k: bounded_str(body, k) for k in ("task_id", "agent_name", "external_id")}

        def create() -> tuple[str, str]:
            with gw.factory() as db, db.begin():
                now = utcnow()
                row = SessionRow(
                    id=new_session_id(),
                    project_id=p.project_id,
                    task_id=fields["task_id"],
                    agent_name=fields["agent_name"],
                    external_id=fields["external_id"],
                    api_key_id=None,
                    status="open",
                    created_at=now,
                    last_activity_at=now,
                    meta=meta,
                )
                db.add(row)
                db.flush()
                key, secret = create_key(
                    db,
                    p.project_id,
                    "agent",
                    name=f"session {row.id}",
                    session_id=row.id,
                    parent_key_id=None if p.key_id == BOOTSTRAP_ADMIN_ID else p.key_id,
                    actor=p.key_id,
                )
                row.api_key_id = key.id
                return row.id, secret

        sid, secret = await asyncio.to_thread(create)
        return JSONResponse(
            {
                "id": sid,
                "object": "session",
                "api_key": secret,
                "project_id": p.project_id,
                "status": "open",
            },
            status_code=201,
        )

    @app.post("/v1/sessions/{session_id}/end")
    async def end_session(session_id: str, request: Request) -> dict[str, Any]:
        gw = gw_of(request)
        p = await principal(request)
        require_kind(p, "agent", "admin")

        def end() -> tuple[dict[str, Any], bool]:
            with gw.factory() as db, db.begin():
                row = db.get(SessionRow, session_id)
                if (
                    row is None
                    or row.project_id != p.project_id
                    or (p.session_id and p.session_id != session_id)
                ):
                    raise APIError(404, f"no session {session_id}")
                closed_now = row.status == "open"
                if closed_now:
                    row.status = "closed"
                    row.closed_at = utcnow()
                return {"id": row.id, "object": "session", "status": row.status}, closed_now

        out, closed_now = await asyncio.to_thread(end)
        if closed_now:  # settle credit assignment, run the project's verifiers
            await asyncio.to_thread(session_closed, gw.factory, session_id)
        return out

    from gateway import anthropic_routes, areal_routes, feedback_routes, responses_routes
    from gateway.admin import api as admin_api
    from gateway.admin import pages as admin_pages

    for mod in (
        anthropic_routes,
        responses_routes,
        feedback_routes,
        areal_routes,
        admin_pages,
        admin_api,
    ):
        app.include_router(mod.router)
    return app


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = ".".join(str(x) for x in err.get("loc", ()))
        return error_response(request, APIError(400, f"invalid request at {loc}: {err['msg']}"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "not found" if exc.status_code == 404 else str(exc.detail)
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return error_response(request, APIError(exc.status_code, message))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, DB_DOWN):  # e.g. feedback or an admin read while it is down
            log.warning("database unreachable on %s: %s", request.url.path, exc)
            return error_response(request, db_down_error())
        log.exception("unexpected error on %s", request.url.path)
        return error_response(request, APIError(500, "internal error; see the gateway log"))


class MetricsMiddleware:
    """Counts requests and latency per route. Pure ASGI (no BaseHTTPMiddleware), so
    streaming responses keep noticing client disconnects."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = {"code": 500}

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            gw = getattr(scope["app"].state, "gw", None) if "app" in scope else None
            if gw is not None:
                gw.metrics.requests.labels(route, str(status["code"])).inc()
                gw.metrics.latency.labels(route).observe(time.monotonic() - started)
