"""The gateway FastAPI application: wiring (state, middleware, error handlers, routers)
and the operational routes (``/health``, ``/metrics``)."""

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
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core import serving_events
from core.db import DB_DOWN, check_connection, make_engine, session_factory
from core.errors import APIError
from core.migrate import current
from core.settings import ConfigError, Settings, get_settings
from gateway.api.registry import APIS
from gateway.call.parsing import TOOL_PARSERS
from gateway.call.pipeline import Pipeline
from gateway.call.render_pool import RenderPool
from gateway.call.sessions import SessionStore
from gateway.call.templating import ChatRenderer, load_tokenizer
from gateway.edge.auth import Authenticator
from gateway.edge.body_limit import BodyLimitMiddleware
from gateway.edge.boundary import UrlCheckMiddleware
from gateway.edge.errors import db_down_error, error_response
from gateway.edge.metrics import Metrics
from gateway.edge.ratelimit import RateLimitMiddleware
from gateway.engines.adapter_leases import Leases
from gateway.engines.adapter_sync import AdapterSync
from gateway.engines.engine_client import EngineClient
from gateway.engines.serving_cache import ServingPolicy
from gateway.engines.unloads import Unloads
from gateway.recording.next_turn import NextTurnDispatch
from gateway.recording.recorder import Recorder
from gateway.recording.redaction import RedactionPolicy
from gateway.routes import exposure
from gateway.routes.request_context import gw_of
from gateway.state import Gateway

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


def build_tracing(settings: Settings) -> Any:
    """The OpenTelemetry tracer of model calls (gateway/call/tracing.py) when
    RLGATE_OTLP_ENDPOINT is set, else None: OpenTelemetry's SDK is imported only then."""
    if not settings.otlp_endpoint:
        return None
    try:
        from gateway.call.tracing import Tracing
    except ImportError as e:
        raise ConfigError(
            f"RLGATE_OTLP_ENDPOINT is set but OpenTelemetry is not installed ({e}); "
            "install it with pip install 'rlgate[otel]'"
        ) from None
    return Tracing(settings.otlp_endpoint, capture_content=settings.otlp_capture_content)


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
        router=settings.engine_router_url or None,
        queue_wait_s=settings.engine_queue_wait_s,
    )
    leases = Leases()  # requests in flight per adapter: the pipeline's, read by the two below
    adapter_sync = AdapterSync(
        engines, factory, settings.engine_sync_s, settings.engine_router_worker_list, leases
    )
    unloads = Unloads(leases, adapter_sync, factory, settings.unload_wait_s)
    sessions = SessionStore(factory, settings.session_idle_timeout_s)
    next_turn = NextTurnDispatch(factory)
    recorder = Recorder(
        factory,
        settings.data_dir / "spool",
        fsync=settings.spool_fsync,
        on_sessions_written=sessions.committed,
        on_followups_written=next_turn.committed,
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
        commit_wait_s=settings.commit_wait_s,
        leases=leases,
        tracing=build_tracing(settings),
    )
    admin = settings.admin_key.get_secret_value() if settings.admin_key else None
    auth = Authenticator(factory, admin, settings.default_project, settings.session_key_grace_s)
    return Gateway(
        settings,
        factory,
        auth,
        pipeline,
        recorder,
        engines,
        metrics,
        tokenizer,
        adapter_sync,
        next_turn,
        unloads,
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = build_gateway(settings)
        if gw.next_turn is not None:
            gw.next_turn.start()  # before the recorder: its start-up replay hands turns over
        gw.recorder.start()
        app.state.gw = gw

        async def housekeeping() -> None:
            while True:
                await asyncio.sleep(30)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(gw.pipeline.sessions.expire_idle)

        tasks = [asyncio.create_task(housekeeping()), asyncio.create_task(gw.adapter_sync.run())]
        notices = None
        if serving_events.listens(settings.effective_database_url):
            notices = serving_events.Listener(
                settings.effective_database_url, gw.pipeline.serving.forget
            )
            notices.start()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            if gw.unloads is not None:
                await gw.unloads.close()
            if notices is not None:
                await asyncio.to_thread(notices.stop)
            await gw.engines.close()
            gw.pipeline.render_pool.close()
            await asyncio.to_thread(gw.recorder.stop)
            if gw.next_turn is not None:
                await asyncio.to_thread(gw.next_turn.stop)
            if gw.pipeline.tracing is not None:  # the spans still queued, then stop
                await asyncio.to_thread(gw.pipeline.tracing.shutdown)

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
    app.add_middleware(UrlCheckMiddleware)
    app.add_middleware(RateLimitMiddleware)
    app.add_middleware(MetricsMiddleware)
    exposure.install_openapi(app)

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

    from gateway.admin import api as admin_api
    from gateway.admin import pages as admin_pages
    from gateway.api import models
    from gateway.routes import areal_routes, feedback_routes, session_routes

    for api in APIS:
        app.include_router(api.router)
    for mod in (
        models,
        session_routes,
        feedback_routes,
        areal_routes,
        admin_pages,
        admin_api,
    ):
        app.include_router(mod.router)
    return app


def install_error_handlers(app: FastAPI) -> None:
    """Errors in the calling API's format: the registered APIs (``app.state.apis``, which
    gateway/edge/errors.py and the rate limiter's model paths read) and the handlers."""
    app.state.apis = APIS

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

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
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
