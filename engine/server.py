"""The HTTP server: SGLang's native protocol subset on FastAPI.

The event loop only parses, validates and waits; the model belongs to the scheduler
thread (``engine.scheduler``). ``serve`` blocks; ``BackgroundServer`` runs the same app
in a thread of the calling process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from engine import scheduler as sched
from engine.auth import ApiKeyMiddleware
from engine.grammar import GrammarCompiler, GrammarError
from engine.llama import LlamaModel
from engine.lora import (
    DEFAULT_TARGET_MODULES,
    AdapterError,
    AdapterRegistry,
    check_adapter_dir,
    read_peft_adapter,
)
from engine.model_files import resolve_model_dir
from engine.protocol import (
    AbortReq,
    GenerateItem,
    GenerateReqInput,
    LoadLoRAAdapterReqInput,
    ProtocolError,
    UnloadLoRAAdapterReqInput,
    normalize,
)

log = logging.getLogger("rlgate.engine")

DEFAULT_CONTEXT_LENGTH = 4096
UNLOAD_WAIT_S = 600.0


@dataclass
class EngineConfig:
    model_path: str
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "float32"
    max_lora_rank: int = 64
    lora_target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    max_loaded_loras: int = 8
    max_running_requests: int = 16
    context_length: int | None = None
    served_model_name: str | None = None
    log_level: str = "info"
    num_threads: int | None = None
    lora_paths: dict[str, str] = field(default_factory=dict)
    prefix_reuse: bool = True
    prefix_cache_slots: int = 4
    api_key: str | None = None  # --api-key: required as "Authorization: Bearer <key>"
    allowed_lora_dir: Path | None = None  # --allowed-lora-dir: adapters only from under it


class Engine:
    """Model, tokenizer, adapters and the scheduler thread, ready to serve."""

    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_dir = resolve_model_dir(config.model_path, Path(config.data_dir))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
        self.model = LlamaModel(self.model_dir, dtype=dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.grammars = GrammarCompiler(self.tokenizer, self.model.cfg.vocab_size)
        eos: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        with contextlib.suppress(OSError):
            gen = GenerationConfig.from_pretrained(str(self.model_dir))
            ids = gen.eos_token_id
            eos.update([ids] if isinstance(ids, int) else list(ids or []))
        self.eos_token_ids = eos
        cfg = self.model.cfg
        self.context_length = config.context_length or min(
            cfg.max_position_embeddings, DEFAULT_CONTEXT_LENGTH
        )
        self.served_model_name = config.served_model_name or config.model_path
        self.allowed_modules = frozenset(config.lora_target_modules)
        self.registry = AdapterRegistry(config.max_loaded_loras)
        self.scheduler = sched.Scheduler(
            self.model,
            self.tokenizer,
            self.eos_token_ids,
            self.registry,
            max_running=config.max_running_requests,
            context_length=self.context_length,
            num_threads=config.num_threads,
            prefix_reuse=config.prefix_reuse,
            prefix_cache_slots=config.prefix_cache_slots,
        )
        for name, path in config.lora_paths.items():
            self.load_adapter(name, path, pinned=True)
        self.created = int(time.time())

    def load_adapter(self, name: str, path: str, pinned: bool) -> None:
        check_adapter_dir(path, self.config.allowed_lora_dir)
        self.registry.reserve_check(name)
        cfg = self.model.cfg
        adapter = read_peft_adapter(
            name,
            path,
            num_layers=cfg.num_layers,
            module_shape={m: cfg.module_shape(m) for m in DEFAULT_TARGET_MODULES},
            max_rank=self.config.max_lora_rank,
            allowed_modules=self.allowed_modules,
            dtype=self.model.dtype,
        )
        adapter.pinned = pinned
        self.registry.add(adapter)

    # ---- request building ---------------------------------------------------------------

    def build_requests(
        self, items: list[GenerateItem], stream: bool, text_in_logprobs: bool
    ) -> list[sched.Request]:
        """Validate every item, then build the requests and acquire their adapters; raises
        ProtocolError/AdapterError. On any error, adapters acquired so far are released."""
        vocab = self.model.cfg.vocab_size
        specs: list[tuple[GenerateItem, list[int], Any]] = []
        for item in items:
            if item.input_ids is not None:
                ids = item.input_ids
            else:
                ids = list(self.tokenizer(item.text or "")["input_ids"])
            if not ids:
                raise ProtocolError("the prompt is empty: send at least one input token")
            if min(ids) < 0 or max(ids) >= vocab:
                raise ProtocolError(f"input_ids must be token ids in [0, {vocab})")
            params = item.params.to_params()
            if len(ids) + params.max_new_tokens > self.context_length:
                raise ProtocolError(
                    f"the prompt ({len(ids)} tokens) plus max_new_tokens "
                    f"({params.max_new_tokens}) exceeds the context length "
                    f"({self.context_length} tokens); shorten the prompt or lower max_new_tokens"
                )
            if item.top_logprobs_num > vocab:
                raise ProtocolError(f"top_logprobs_num must be <= {vocab}")
            constraint = item.params.constraint()
            if constraint is not None:
                try:
                    params = replace(params, grammar=self.grammars.grammar(*constraint))
                except GrammarError as e:
                    raise ProtocolError(str(e)) from None
            specs.append((item, ids, params))
        requests: list[sched.Request] = []
        try:
            for item, ids, params in specs:
                base_rid = item.rid or uuid.uuid4().hex
                for j in range(item.params.n):
                    rid = f"{base_rid}-{j}" if item.params.n > 1 else base_rid
                    req = sched.Request(
                        rid=rid,
                        input_ids=list(ids),
                        params=params,
                        sink=_no_sink,
                        return_logprob=item.return_logprob,
                        top_logprobs_num=item.top_logprobs_num if item.return_logprob else 0,
                        return_text_in_logprobs=text_in_logprobs,
                        stream=stream,
                    )
                    if params.grammar is not None:
                        req.constraint = self.grammars.constraint(params.grammar)
                    requests.append(req)  # before acquiring, so an error releases it
                    if item.lora_name:
                        req.adapter = self.registry.acquire(item.lora_name)
        except BaseException:
            self.release(requests)
            raise
        return requests

    def release(self, requests: list[sched.Request]) -> None:
        """Release the adapters of requests that never reached the scheduler."""
        for req in requests:
            if req.adapter is not None:
                self.registry.release(req.adapter)
                req.adapter = None


def _no_sink(payload: dict[str, Any], final: bool) -> None:  # replaced before submit
    raise RuntimeError("request submitted without a sink")


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
            "version": "rlgate-embedded",
            "decode_steps": scheduler.steps,
            "prefix_reused_tokens": scheduler.prefix.reused_tokens if scheduler.prefix else 0,
            "prefix_cache_slots": scheduler.prefix.spare_slots if scheduler.prefix else 0,
            "prefix_cached_sequences": len(scheduler.prefix.retired) if scheduler.prefix else 0,
            "lora_use_counts": engine.registry.use_counts(),
            **scheduler.load,
        }

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, Any]:
        return {"weight_version": scheduler.weight_version}

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

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        try:
            body = LoadLoRAAdapterReqInput.model_validate(await request.json())
        except ValidationError as exc:
            return _lora_result(False, _validation_message(exc))
        except ValueError as exc:
            return _lora_result(False, f"invalid JSON: {exc}")
        try:
            await asyncio.to_thread(
                engine.load_adapter, body.lora_name, body.lora_path, body.pinned
            )
        except AdapterError as exc:
            return _lora_result(False, str(exc))
        except Exception as exc:  # unreadable files etc.
            log.exception("loading adapter %s failed", body.lora_name)
            return _lora_result(False, f"could not load {body.lora_path}: {exc}")
        return _lora_result(True)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        try:
            body = UnloadLoRAAdapterReqInput.model_validate(await request.json())
        except ValidationError as exc:
            return _lora_result(False, _validation_message(exc))
        except ValueError as exc:
            return _lora_result(False, f"invalid JSON: {exc}")
        try:
            await asyncio.to_thread(engine.registry.unload, body.lora_name, UNLOAD_WAIT_S)
        except AdapterError as exc:
            return _lora_result(False, str(exc))
        return _lora_result(True)

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> Response:
        try:
            raw = await request.json()
        except ValueError as exc:
            return _error(f"invalid JSON body: {exc}")
        try:
            body = GenerateReqInput.model_validate(raw)
            items, single = normalize(body)
            reqs = engine.build_requests(items, body.stream, body.return_text_in_logprobs)
        except ValidationError as exc:
            return _error(_validation_message(exc))
        except (ProtocolError, AdapterError) as exc:
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
        "engine ready: %s (context %d, %d slots)",
        engine.model_dir,
        engine.context_length,
        config.max_running_requests,
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
