"""The event loop only routes: prompts are rendered and tokenized on the render pool under
a time limit, bodies are size-limited, over-long prompts are refused before tokenizing,
and clients may set only known chat-template switches.

The gateway here is the real app (``create_app``) served by uvicorn on loopback, in a
thread of the test process, with the real packaged tokenizer, in front of a fake engine
(tests/gateway/fake_engine.py: a 2048-token context, as the session's engine; what is
tested happens before a call reaches the engine): in-process so the test can wrap the
tokenizer with ``GatedTokenizer``, which counts render calls and can hold one at a gate.
The real template and tokenizer still do the work; the gate only makes "a render is in
progress" a state the test controls, so assertions are about ordering, never wall-clock
time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from core.settings import Settings
from gateway.app import create_app
from gateway.call.request import Message
from gateway.call.templating import MIN_PROMPT_CHARS
from gateway.state import Gateway
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.fake_engine import serving as serving_engine
from tests.servers import free_port, packaged_model_dir

BODY_LIMIT = 4 * 1024 * 1024  # the default of RLGATE_MAX_BODY_BYTES
CHARS_PER_TOKEN = 16.0


class GatedTokenizer:
    """The real tokenizer; counts ``apply_chat_template``/``encode`` calls and, while the
    gate is shut, holds each render (in the render pool's thread) until it opens."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._lock = threading.Lock()
        self.renders = 0
        self.encodes = 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def hold(self) -> None:
        self.entered.clear()
        self.gate.clear()

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.renders += 1
        self.entered.set()
        if not self.gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        return self._real.apply_chat_template(*args, **kwargs)

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.encodes += 1
        return self._real.encode(*args, **kwargs)

    def calls(self) -> tuple[int, int]:
        with self._lock:
            return self.renders, self.encodes


@dataclass
class Live:
    url: str
    gw: Gateway
    tok: GatedTokenizer
    key: str

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}", **kw.pop("headers", {})}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=120, **kw)

    @property
    def char_limit(self) -> int:
        ctx = self.gw.pipeline.renderer.context_length
        return max(int(ctx * CHARS_PER_TOKEN), MIN_PROMPT_CHARS)


@pytest.fixture(scope="module")
def fake_engine_url() -> Iterator[str]:
    with serving_engine(FakeEngine().app()) as url:
        yield url


@pytest.fixture(scope="module")
def live(fake_engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("gw-loop")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    settings = Settings(
        data_dir=data_dir,
        database_url=db_url,
        engine_urls=fake_engine_url,
        tokenizer_path=str(packaged_model_dir()),
        log_level="warning",
        render_workers=2,
        prompt_chars_per_token=CHARS_PER_TOKEN,
    )
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive(), "the gateway thread exited during start-up"
        assert time.monotonic() < deadline, "the gateway did not start within 120 s"
        time.sleep(0.1)
    db_engine = make_engine(db_url)
    with transaction(session_factory(db_engine)) as db:
        _, key = create_key(db, "p1", "agent")
    gw: Gateway = app.state.gw
    tok = GatedTokenizer(gw.pipeline.renderer.tokenizer)
    gw.pipeline.renderer.tokenizer = tok
    live = Live(f"http://127.0.0.1:{port}", gw, tok, key)
    # one real call: checks the stack and takes the engine's context length (2048)
    r = live.post("/v1/chat/completions", _chat("hi", max_tokens=2))
    assert r.status_code == 200, r.text
    assert gw.pipeline.renderer.context_length == 2048
    try:
        yield live
    finally:
        tok.gate.set()
        server.should_exit = True
        thread.join(60)
        db_engine.dispose()


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def _anthropic(text: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}


def test_health_answers_while_a_long_prompt_is_rendered(live: Live) -> None:
    # under the character limit, over the 2048-token context: tokenized, then refused
    text = "word " * ((live.char_limit - 1000) // 5)
    live.tok.hold()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(live.post, "/v1/chat/completions", _chat(text))
        try:
            assert live.tok.entered.wait(60), "the long prompt never reached the renderer"
            health = httpx.get(live.url + "/health", timeout=30)
            models = httpx.get(
                live.url + "/v1/models", headers={"Authorization": f"Bearer {live.key}"}
            )
            still_rendering = not call.done()
        finally:
            live.tok.gate.set()
        r = call.result(timeout=120)
    assert health.status_code == 200, health.text
    assert models.status_code == 200, models.text
    assert still_rendering, "the long prompt finished before /health was asked"
    assert r.status_code == 400, r.text
    assert "tokens but the model's context is 2048" in r.json()["error"]["message"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_8mb_body_is_413_in_the_client_format(live: Live, chunked: bool) -> None:
    before = live.tok.calls()
    body = json.dumps(_chat("x" * (8 * 1024 * 1024))).encode()

    def content() -> Any:
        if not chunked:
            return body
        return (body[i : i + 65536] for i in range(0, len(body), 65536))

    headers = {"Authorization": f"Bearer {live.key}", "Content-Type": "application/json"}
    r = httpx.post(
        live.url + "/v1/chat/completions", content=content(), headers=headers, timeout=120
    )
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert str(BODY_LIMIT) in err["message"] and "RLGATE_MAX_BODY_BYTES" in err["message"]

    a = httpx.post(
        live.url + "/v1/messages",
        content=content(),
        headers={"x-api-key": live.key, "anthropic-version": "2023-06-01"},
        timeout=120,
    )
    assert a.status_code == 413, a.text
    assert a.json()["type"] == "error"
    assert a.json()["error"]["type"] == "request_too_large"
    assert live.tok.calls() == before  # nothing was rendered
    assert live.post("/v1/chat/completions", _chat("hi", max_tokens=1)).status_code == 200


def test_prompt_over_the_char_limit_is_400_before_tokenizing(live: Live) -> None:
    text = "x" * (live.char_limit + 1)
    body = _chat("a" * 300_000)  # > 256 KiB: parsed off the loop, still under the body limit
    body["messages"][0]["content"] = text + body["messages"][0]["content"]
    n = len(body["messages"][0]["content"])
    before = live.tok.calls()
    r = live.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    msg = err["message"]
    assert err["param"] == "messages"
    assert f"{n} characters" in msg and str(live.char_limit) in msg and "2048-token" in msg
    assert "RLGATE_PROMPT_CHARS_PER_TOKEN" in msg
    a = live.post(
        "/v1/messages/count_tokens",
        {"model": "m", "messages": [{"role": "user", "content": text}]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert a.status_code == 400, a.text
    assert a.json()["error"]["type"] == "invalid_request_error"
    assert str(live.char_limit) in a.json()["error"]["message"]
    assert live.tok.calls() == before  # neither the template nor the tokenizer ran


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"chat_template": "{% for i in range(10**9) %}x{% endfor %}"}, "chat_template"),
        ({"tokenize": True}, "tokenize"),
        ({"enable_thinking": "yes"}, "enable_thinking"),
        ({"reasoning_effort": "max"}, "reasoning_effort"),
    ],
    ids=["chat_template", "tokenize", "non-bool", "unknown-effort"],
)
def test_only_known_template_kwargs(live: Live, kwargs: dict, needle: str) -> None:
    before = live.tok.calls()
    r = live.post("/v1/chat/completions", _chat("hi", chat_template_kwargs=kwargs))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"chat_template_kwargs.{needle}"
    if needle in ("chat_template", "tokenize"):
        assert "accepts only: enable_thinking" in err["message"]
    assert live.tok.calls() == before


def test_allowed_template_kwargs_render(live: Live) -> None:
    body = _chat("hi", max_tokens=1, chat_template_kwargs={"enable_thinking": False})
    assert live.post("/v1/chat/completions", body).status_code == 200


def test_render_timeout_is_503_and_the_gateway_keeps_serving(live: Live) -> None:
    pool = live.gw.pipeline.render_pool
    saved = pool.timeout_s
    pool.timeout_s = 0.5
    live.tok.hold()
    try:
        r = live.post("/v1/chat/completions", _chat("hello"))
        a = live.post(
            "/v1/messages", _anthropic("hello"), headers={"anthropic-version": "2023-06-01"}
        )
        # both renders are still held (each keeps its worker): the loop still answers
        health = httpx.get(live.url + "/health", timeout=30)
    finally:
        live.tok.gate.set()
        pool.timeout_s = saved
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert err["type"] == "service_unavailable" and "longer than 0.5 s" in err["message"]
    assert a.status_code == 503, a.text
    assert a.json()["error"]["type"] == "overloaded_error"
    assert health.status_code == 200
    ok = live.post("/v1/chat/completions", _chat("hello", max_tokens=2))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_json_is_400(live: Live, depth: int) -> None:
    raw = b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    r = httpx.post(
        live.url + "/v1/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {live.key}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert "nested" in r.json()["error"]["message"]


def test_an_output_limit_that_does_not_fit_renders_the_prompt_once(live: Live) -> None:
    """Anthropic's max_tokens is an upper bound (Claude Code asks for 32000 whatever the
    context): such a call is answered from one render of its prompt, the output limit
    being what the context leaves (gateway/call/output_limit.py), not from a second render
    after a refusal."""
    renderer = live.gw.pipeline.renderer

    def prompt_tokens(text: str) -> int:
        return len(renderer.render([Message("user", text)], [], {})[1])

    base, per = prompt_tokens(""), prompt_tokens(" hello" * 100) - prompt_tokens("")
    assert per == 100  # " hello" is one token: the prompt's length is set exactly
    text = " hello" * (renderer.context_length - base - 3)
    assert prompt_tokens(text) == renderer.context_length - 3
    body = {"model": "m", "max_tokens": 32000, "messages": [{"role": "user", "content": text}]}
    before = live.tok.calls()
    r = live.post("/v1/messages", {**body, "temperature": 0})
    assert r.status_code == 200, r.text
    assert live.tok.calls()[0] == before[0] + 1  # the chat template ran once
    out = r.json()
    assert out["usage"]["input_tokens"] == renderer.context_length - 3
    assert out["usage"]["output_tokens"] <= 3
    if out["usage"]["output_tokens"] == 3:  # cut by the context, not by the client's limit
        assert out["stop_reason"] == "model_context_window_exceeded"
