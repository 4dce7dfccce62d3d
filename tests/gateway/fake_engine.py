"""The fast in-process tier: the real gateway app (``create_app``, real tokenizer, real
SQLite recording) served by uvicorn in a thread of the test process, in front of a fake
engine that speaks SGLang's native protocol (``/generate`` streamed or not, ``/health``,
``/get_server_info``, ``/v1/models``, ``/abort_request``, ``/load_lora_adapter`` and
``/unload_lora_adapter``, which only keep a list) and that the test controls.

The fake engine answers every ``/generate`` with the same short text (``TEXT``), unless
the test ``script()``-ed the next answers (an :class:`Answer` each, in arrival order); like
an engine, it cuts an answer to the request's ``max_new_tokens`` (finish ``length``,
else ``stop`` on its end-of-sequence token) and streams it token by token, each chunk
carrying everything so far (SGLang's cumulative chunks). While it is ``hold()``-ing, each
request waits until the test ``release()``s it (oldest first), so a test can fill the
gateway's engine slots and decide when one frees up. It records every ``/generate`` body
in arrival order (``arrivals``), so tests assert on what reached the engine and in which
order, never on wall-clock time.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from core.settings import Settings, get_settings
from gateway.app import create_app
from tests.servers import IN_PROCESS_ENVS, free_port, gateway_env

# "Hello there, how can I help?" + <|im_end|> in SmolLM2's vocabulary, and each token's text
IDS = [19556, 665, 28, 638, 416, 339, 724, 47, 2]
TEXT = "Hello there, how can I help?"
PIECES = ["Hello", " there", ",", " how", " can", " I", " help", "?", ""]


@dataclass(frozen=True)
class Answer:
    """What the fake engine generates for one request: its tokens and each token's text
    (an end-of-sequence token's is empty, as with ``skip_special_tokens``)."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]

    @classmethod
    def of(cls, tokenizer: Any, text: str) -> Answer:
        """``text`` in ``tokenizer``'s tokens, then its end-of-sequence token."""
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces: list[str] = []
        so_far = ""
        for k in range(1, len(ids) + 1):
            now = tokenizer.decode(ids[:k], skip_special_tokens=True)
            pieces.append(now[len(so_far) :])
            so_far = now
        assert so_far == text, f"{text!r} does not decode back from its tokens"
        return cls((*ids, tokenizer.eos_token_id), (*pieces, ""))


DEFAULT = Answer(tuple(IDS), tuple(PIECES))


def _meta(body: dict[str, Any], ids: list[int], finish: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": body.get("rid") or "fake",
        "finish_reason": finish,
        "prompt_tokens": len(body.get("input_ids") or []),
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "output_token_logprobs": [[-0.5, i, None] for i in ids],
        "weight_version": "fake",
        "e2e_latency": 0.0,
    }


def _generated(body: dict[str, Any], answer: Answer) -> tuple[list[int], list[str], dict[str, Any]]:
    """``answer`` cut to the request's ``max_new_tokens``, and the finish reason."""
    params = body.get("sampling_params")
    limit = params.get("max_new_tokens") if isinstance(params, dict) else None
    ids, pieces = list(answer.ids), list(answer.pieces)
    if limit is not None and len(ids) > limit:
        return ids[:limit], pieces[:limit], {"type": "length", "length": limit}
    return ids, pieces, {"type": "stop", "matched": ids[-1]}


class FakeEngine:
    def __init__(self) -> None:
        self.url = ""
        self._lock = threading.Lock()
        self.arrivals: list[dict[str, Any]] = []
        self.traceparents: list[str | None] = []  # each /generate's W3C traceparent header
        self._holding = False
        self._released = 0  # how many of the held requests may finish, oldest first
        self._done = 0
        self.adapters: dict[str, str] = {}  # loaded LoRA adapters: name -> path
        # each /unload_lora_adapter: (name, requests naming it that had not finished)
        self.unloads: list[tuple[str, int]] = []
        self.listings = 0  # GET /v1/models answered (each adapter sync round asks once)
        self._scripted: deque[Answer] = deque()

    # ---- control (from the test's thread) ----------------------------------------------

    def hold(self) -> None:
        with self._lock:
            self._holding = True
            self._released = len(self.arrivals)

    def script(self, *answers: Answer) -> None:
        """The next ``/generate`` requests answer these, one each in arrival order; the
        ones after them the default text again."""
        with self._lock:
            self._scripted.extend(answers)

    def release(self, n: int = 1) -> None:
        with self._lock:
            self._released += n

    def open(self) -> None:
        with self._lock:
            self._holding = False

    def wait_arrivals(self, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.arrivals) >= n:
                    return list(self.arrivals)
            assert time.monotonic() < deadline, f"fewer than {n} requests reached the engine"
            time.sleep(0.01)

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    # ---- the engine ----------------------------------------------------------------------

    async def _turn(self, index: int) -> None:
        while True:
            with self._lock:
                if not self._holding or index < self._released:
                    return
            await asyncio.sleep(0.005)

    def in_flight(self, adapter: str) -> int:
        """Requests naming ``adapter`` that reached the engine and have not finished."""
        with self._lock:
            return sum(
                1 for a in self.arrivals if a.get("lora_path") == adapter and not a.get("_done")
            )

    async def generate(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            index = len(self.arrivals)
            self.arrivals.append(body)
            self.traceparents.append(request.headers.get("traceparent"))
            answer = self._scripted.popleft() if self._scripted else DEFAULT
        await self._turn(index)
        with self._lock:
            self._done += 1
            body["_done"] = True
        ids, pieces, finish = _generated(body, answer)
        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                for k in range(1, len(ids) + 1):
                    last = k == len(ids)
                    chunk = {
                        "text": "".join(pieces[:k]),
                        "output_ids": ids[:k],
                        "meta_info": _meta(body, ids[:k], finish if last else None),
                    }
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        meta = _meta(body, ids, finish)
        return JSONResponse({"text": "".join(pieces), "output_ids": ids, "meta_info": meta})

    def app(self) -> Starlette:
        async def ok(request: Request) -> JSONResponse:
            await request.body()
            return JSONResponse({})

        async def info(request: Request) -> JSONResponse:
            return JSONResponse({"context_length": 2048, "max_running_requests": 64})

        async def models(request: Request) -> JSONResponse:
            with self._lock:
                self.listings += 1
                loras = [{"id": n, "root": p, "parent": "base"} for n, p in self.adapters.items()]
            return JSONResponse({"object": "list", "data": [{"id": "base"}, *loras]})

        async def load(request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                self.adapters[body["lora_name"]] = body["lora_path"]
            return JSONResponse({"success": True})

        async def unload(request: Request) -> JSONResponse:
            name = (await request.json())["lora_name"]
            busy = self.in_flight(name)
            with self._lock:
                self.unloads.append((name, busy))
                if self.adapters.pop(name, None) is None:
                    message = f"LoRA with name {name} does not exist"
                    return JSONResponse({"success": False, "error_message": message}, 400)
            return JSONResponse({"success": True})

        return Starlette(
            routes=[
                Route("/generate", self.generate, methods=["POST"]),
                Route("/abort_request", ok, methods=["POST"]),
                Route("/health", ok),
                Route("/get_server_info", info),
                Route("/v1/models", models),
                Route("/load_lora_adapter", load, methods=["POST"]),
                Route("/unload_lora_adapter", unload, methods=["POST"]),
            ]
        )


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on loopback in a thread; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive(), "the server thread exited during start-up"
        assert time.monotonic() < deadline, "the server did not start within 120 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


@dataclass
class InProcess:
    """A gateway served from this process: its URL and its app."""

    url: str
    app: Any


@contextmanager
def in_process_gateway(
    data_dir: Path, db_url: str, engine_url: str, **settings: str
) -> Iterator[InProcess]:
    """What ``tests.servers.gateway`` starts, without the process: the same settings, read
    from the same ``RLGATE_*`` variables (so ``judges`` is the JSON an operator writes),
    the gateway app served by uvicorn in a thread of the test process. For tests of
    what the gateway answers, not of how its process starts, stops or dies; its start-up
    costs about a second instead of a process's interpreter, imports and tokenizer load."""
    env = gateway_env(data_dir, db_url, engine_url, **settings)
    # set while it serves: some code reads the process's settings (get_settings(): the
    # operator's grants, trainer/verifiers.py), as it would in a gateway process
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    IN_PROCESS_ENVS.append(env)
    get_settings.cache_clear()
    try:
        app = create_app(Settings())
        with serving(app) as url:
            yield InProcess(url, app)
    finally:
        IN_PROCESS_ENVS.remove(env)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_settings.cache_clear()


class FastStack:
    """The gateway (in this process) in front of a :class:`FakeEngine`."""

    def __init__(self, url: str, engine: FakeEngine, keys: dict[str, str], app: Any) -> None:
        self.url = url
        self.engine = engine
        self.keys = keys  # project -> an agent key of it
        self.app = app

    def post(
        self, path: str, body: Any, project: str = "p1", timeout: float = 120
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[project]}"}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=timeout)


@contextmanager
def fast_stack(data_dir: Path, model_dir: Path, **settings: Any) -> Iterator[FastStack]:
    """A fake engine and the gateway in front of it, projects p1 and p2 with a key each."""
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    db = make_engine(db_url)
    keys = {}
    with transaction(session_factory(db)) as s:
        for project in ("p1", "p2"):
            _, keys[project] = create_key(s, project, "agent")
    engine = FakeEngine()
    with serving(engine.app()) as engine_url:
        engine.url = engine_url
        app = create_app(
            Settings(
                data_dir=data_dir,
                database_url=db_url,
                engine_urls=engine_url,
                tokenizer_path=str(model_dir),
                log_level="warning",
                render_workers=2,
                **settings,
            )
        )
        with serving(app) as url:
            try:
                yield FastStack(url, engine, keys, app)
            finally:
                engine.open()  # held requests finish, so the gateway can stop
    db.dispose()
