"""The HTTP server: SGLang's native protocol subset on FastAPI, in front of the ``Engine``
object (``engine/runtime.py``: model, tokenizer, adapters, the scheduler thread).

The event loop only parses, validates and waits; the model belongs to the scheduler
thread (``engine.scheduler``). ``serve`` blocks; ``BackgroundServer`` runs the same app
in a thread of the calling process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from engine import scheduler as sched
from engine.auth import ApiKeyMiddleware
from engine.lora import AdapterError
from engine.protocol import (
    AbortReq,
    GenerateReqInput,
    LoadLoRAAdapterReqInput,
    ProtocolError,
    UnloadLoRAAdapterReqInput,
    normalize,
)
from engine.runtime import Engine, EngineConfig

__all__ = ["BackgroundServer", "Engine", "EngineConfig", "create_app", "serve"]

_Body = TypeVar("_Body", bound=BaseModel)
log = logging.getLogger("rlgate.engine")

UNLOAD_WAIT_S = 600.0


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"])
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts)


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="rlgate embedded engine")
    if engine.config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=engine.config.api_key)
    scheduler = engine.scheduler

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[dict[str, Any]] = loop.create_future()

        def sink(payload: dict[str, Any], final: bool) -> None:
            if final:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(payload))

        req = sched.Request(
            rid=f"health-{uuid.uuid4().hex}",
            input_ids=[engine.tokenizer.bos_token_id or 0],
            params=sched.SamplingParams(max_new_tokens=1, temperature=0.0),
            sink=sink,
        )
        scheduler.submit(req)
        try:
            payload = await asyncio.wait_for(done, timeout=60)
        except TimeoutError:
            scheduler.abort(req.rid)
            return Response(status_code=503)
        ok = payload["meta_info"]["finish_reason"]["type"] != "abort"
        return Response(status_code=200 if ok else 503)

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        return {
            "model_path": engine.config.model_path,
            "tokenizer_path": str(engine.model_dir),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": scheduler.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        }

    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        return {
            "model_path": engine.config.model_path,
            "served_model_name": engine.served_model_name,
            "context_length": engine.context_length,
            "max_running_requests": engine.config.max_running_requests,
            "max_lora_rank": engine.config.max_lora_rank,
            "lora_target_modules": sorted(engine.allowed_modules),
            "max_loaded_loras": engine.config.max_loaded_loras,
            "dtype": engine.config.dtype,
            "weights": engine.config.weights,
            "int4_projections": engine.model.int4_projections,
            "two_pass_lm_head": engine.model.head is not None,
            "version": "rlgate-embedded",
            "decode_steps": scheduler.steps,
            "prefix_reused_tokens": scheduler.prefix.reused_tokens if scheduler.prefix else 0,
            "prefix_cache_slots": scheduler.prefix.spare_slots if scheduler.prefix else 0,
            "prefix_cached_sequences": len(scheduler.prefix.retired) if scheduler.prefix else 0,
            "lora_use_counts": engine.registry.use_counts(),
            **scheduler.load,
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        base = {
            "id": engine.served_model_name,
            "object": "model",
            "created": engine.created,
            "owned_by": "sglang",
            "root": engine.served_model_name,
            "max_model_len": engine.context_length,
            "parent": None,
        }
        data = [base]
        for name, path in engine.registry.names().items():
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": engine.created,
                    "owned_by": "sglang",
                    "root": path,
                    "parent": engine.served_model_name,
                    "max_model_len": engine.context_length,
                }
            )
        return {"object": "list", "data": data}

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        try:
            body = AbortReq.model_validate(await request.json())
        except (ValidationError, ValueError) as exc:
            return _error(f"invalid abort request: {exc}")
        if body.abort_all:
            scheduler.abort_all()
        elif body.rid:
            scheduler.abort(body.rid)
        return Response(status_code=200)

    def _lora_result(success: bool, message: str = "") -> JSONResponse:
        return JSONResponse(
            {
                "success": success,
                "error_message": message,
                "loaded_adapters": engine.registry.names(),
            },
            status_code=200 if success else 400,
        )

    async def _lora_body(request: Request, model: type[_Body]) -> _Body | JSONResponse:
        """The parsed body, or the 400 that says what is wrong with it."""
        try:
            return model.model_validate(await request.json())
        except ValidationError as exc:
            return _lora_result(False, _validation_message(exc))
        except ValueError as exc:
            return _lora_result(False, f"invalid JSON: {exc}")

    async def _lora_call(
        request: Request, model: type[_Body], act: Callable[[_Body], None]
    ) -> JSONResponse:
        """Parse the body as ``model`` and run ``act(body)`` off the event loop; SGLang's
        answer either way (an ``AdapterError`` is a refusal with its message)."""
        body = await _lora_body(request, model)
        if isinstance(body, JSONResponse):
            return body
        try:
            await asyncio.to_thread(act, body)
        except AdapterError as exc:
            return _lora_result(False, str(exc))
        return _lora_result(True)

    def _load(body: LoadLoRAAdapterReqInput) -> None:
        try:
            engine.load_adapter(body.lora_name, body.lora_path, body.pinned)
        except AdapterError:
            raise
        except Exception as exc:  # unreadable files etc.
            log.exception("loading adapter %s failed", body.lora_name)
            raise AdapterError(f"could not load {body.lora_path}: {exc}") from exc

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        return await _lora_call(request, LoadLoRAAdapterReqInput, _load)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        return await _lora_call(
            request,
            UnloadLoRAAdapterReqInput,
            lambda body: engine.registry.unload(body.lora_name, UNLOAD_WAIT_S),
        )

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> Response:
        try:
            raw = await request.json()
        except ValueError as exc:
            return _error(f"invalid JSON body: {exc}")
        try:
            body = GenerateReqInput.model_validate(raw)
            items, single = normalize(body)
        except ValidationError as exc:
            return _error(_validation_message(exc))
        except ProtocolError as exc:
            return _error(str(exc))
        try:
            names = {item.lora_name for item in items if item.lora_name}
            if names - set(engine.registry.names()):
                await asyncio.to_thread(engine.reload_unloaded, names, UNLOAD_WAIT_S)
            reqs = await _build_off_loop(engine, items, body)
        except ValidationError as exc:
            return _error(_validation_message(exc))
        except (ProtocolError, AdapterError) as exc:
            if body.stream:  # as SGLang: found after the stream began, so inside a 200
                return StreamingResponse(_error_stream(str(exc)), media_type="text/event-stream")
            return _error(str(exc))

        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[tuple[int, dict[str, Any], bool]] = asyncio.Queue()
        submitted = 0
        try:
            for index, req in enumerate(reqs):
                req.sink = _make_sink(loop, outbox, index)
            for req in reqs:
                scheduler.submit(req)
                submitted += 1
        except BaseException:  # the scheduler owns (and releases) only what it was given
            engine.release(reqs[submitted:])
            for req in reqs[:submitted]:
                scheduler.abort(req.rid)
            raise
        many = not single or len(reqs) > 1

        if body.stream:
            return StreamingResponse(
                _stream(outbox, reqs, many, scheduler),
                media_type="text/event-stream",
            )
        results: list[dict[str, Any] | None] = [None] * len(reqs)
        pending = len(reqs)
        try:
            while pending:
                try:
                    index, payload, final = await asyncio.wait_for(outbox.get(), timeout=1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        raise asyncio.CancelledError from None
                    continue
                if final:
                    results[index] = payload
                    pending -= 1
        except asyncio.CancelledError:
            for i, req in enumerate(reqs):
                if results[i] is None:
                    scheduler.abort(req.rid)
            raise
        return JSONResponse(results if many else results[0])

    return app


async def _build_off_loop(engine: Engine, items: list[Any], body: Any) -> list[Any]:
    """``engine.build_requests`` on a thread: tokenizing text prompts and compiling
    grammars grows with the request (a constraint is built for every choice, tens of ms
    each for a large forced grammar; llguidance releases the GIL), and on the event loop it
    would hold up every other request's stream. If the request is cancelled meanwhile,
    the adapters the build acquired are released when it returns."""
    job = asyncio.ensure_future(
        asyncio.to_thread(engine.build_requests, items, body.stream, body.return_text_in_logprobs)
    )
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:

        def drop(done: asyncio.Future[list[Any]]) -> None:
            if not done.cancelled() and done.exception() is None:
                engine.release(done.result())

        job.add_done_callback(drop)
        raise


async def _error_stream(message: str) -> AsyncIterator[bytes]:
    """SGLang's stream for a request refused after its stream began: one error event."""
    event = {"error": {"message": message, "type": "invalid_request_error", "code": 400}}
    yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _make_sink(
    loop: asyncio.AbstractEventLoop,
    outbox: asyncio.Queue[tuple[int, dict[str, Any], bool]],
    index: int,
) -> sched.Sink:
    def sink(payload: dict[str, Any], final: bool) -> None:
        loop.call_soon_threadsafe(outbox.put_nowait, (index, payload, final))

    return sink


async def _stream(
    outbox: asyncio.Queue[tuple[int, dict[str, Any], bool]],
    reqs: list[sched.Request],
    many: bool,
    scheduler: sched.Scheduler,
) -> AsyncIterator[bytes]:
    finished = [False] * len(reqs)
    try:
        while not all(finished):
            index, payload, final = await outbox.get()
            if many:
                payload = {**payload, "index": index}
            finished[index] = finished[index] or final
            yield b"data: " + json.dumps(payload).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        for req, done in zip(reqs, finished, strict=True):
            if not done:
                scheduler.abort(req.rid)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


def serve(config: EngineConfig) -> None:
    """Load the model, start the scheduler, and serve HTTP until interrupted (blocking)."""
    _configure_logging(config.log_level)
    engine = Engine(config)
    engine.scheduler.start()
    log.info(
        "engine ready: %s (context %d, %d slots, %s)",
        engine.model_dir,
        engine.context_length,
        config.max_running_requests,
        engine.weights_summary(),
    )
    try:
        uvicorn.run(
            create_app(engine), host=config.host, port=config.port, log_level=config.log_level
        )
    finally:
        engine.scheduler.stop()


class BackgroundServer:
    """The engine served from a thread of this process (for ``rlgate up`` and tools)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        self._server = uvicorn.Server(
            uvicorn.Config(
                create_app(self.engine),
                host=config.host,
                port=config.port,
                log_level=config.log_level,
            )
        )
        self._thread = threading.Thread(
            target=self._server.run, name="rlgate-engine-http", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.engine.scheduler.start()
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"engine HTTP server did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.engine.scheduler.stop()
