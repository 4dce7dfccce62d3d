"""Every failure after a stream's first byte ends the stream in the client's own error
format, then the API's terminator (gateway/api/handler.py ``write_stream``): Chat and
Completions an ``error`` chunk and ``data: [DONE]``, Responses ``response.failed``,
Anthropic an ``error`` event. The error's type comes from the API's registered error
format (gateway/api/spec.py), the one status-to-type table its HTTP errors use too.

The engine killed mid-stream, on the embedded engine and on real SGLang (a dedicated
server of each, since it is killed): four streams at once (Chat, Completions, Responses,
Anthropic), each asked for a long answer (a JSON array of at least 300 numbers), the
engine killed once every stream has sent generated text. Each stream ends with its error
and terminator (503: the engine stopped), its type the one a non-streamed call gets
from the dead engine, and each partial answer is recorded with finish_reason ``abort``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from core.db import make_engine, session_factory
from core.errors import APIError
from core.migrate import upgrade
from gateway.api.anthropic_messages.stream import MessagesStream
from gateway.api.openai_chat.stream import ChatStream
from gateway.api.openai_completions.stream import CompletionStream
from gateway.api.openai_responses.stream import ResponsesStream
from gateway.api.registry import APIS
from gateway.call.request import Sampling
from gateway.edge.errors import OPENAI
from tests.gateway.conftest import Stack
from tests.gateway.fake_engine import in_process_gateway
from tests.gateway.helpers import wait_recorded
from tests.servers import engine_cmd, free_port, running

pytestmark = pytest.mark.timeout(900)

STATUSES = (400, 401, 403, 404, 409, 413, 422, 429, 500, 502, 503, 504)


# ---- one table for HTTP and streams ------------------------------------------------------


def _prep() -> Any:
    req = SimpleNamespace(
        raw={},
        sampling=Sampling(),
        return_token_ids=False,
        include_usage=False,
        prompt_logprobs=False,
    )
    return SimpleNamespace(
        interaction_id="x", policy_version="base", req=req, prompt_ids=[1], limit=None
    )


def _http_type(protocol: str, status: int) -> str:
    """The error type an HTTP answer of ``status`` has on this API (its registered format)."""
    (spec,) = [a for a in APIS if a.protocol.name == protocol]
    return (spec.errors or OPENAI).kind(status)


def _sse(raw: list[bytes]) -> list[tuple[str | None, Any]]:
    """(event name, data) of each server-sent event in ``raw``."""
    out = []
    for block in b"".join(raw).decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:] if line == "data: [DONE]" else json.loads(line[6:])
        out.append((name, data))
    return out


def _chat_type(raw: list[bytes]) -> str:
    (_, err), (_, done) = _sse(raw)
    assert done == "[DONE]"
    return err["error"]["type"]


def _responses_type(raw: list[bytes]) -> str:
    ((name, data),) = _sse(raw)
    assert name == "response.failed" and data["response"]["status"] == "failed"
    return data["response"]["error"]["code"]


def _anthropic_type(raw: list[bytes]) -> str:
    ((name, data),) = _sse(raw)
    assert name == "error" and data["type"] == "error"
    return data["error"]["type"]


WRITERS: dict[str, tuple[Callable[[Any], Any], Callable[[list[bytes]], str]]] = {
    "openai_chat": (lambda p: ChatStream(p, None, "m"), _chat_type),
    "openai_completions": (lambda p: CompletionStream([p], None, "m"), _chat_type),
    "openai_responses": (lambda p: ResponsesStream(p, "m"), _responses_type),
    "anthropic_messages": (lambda p: MessagesStream(p, None, "m"), _anthropic_type),
}


@pytest.mark.parametrize("protocol", sorted(WRITERS))
def test_stream_and_http_errors_have_one_table(protocol: str) -> None:
    """Per API: the same error as an HTTP answer and as a stream's end has the same type
    (Anthropic's stream called a 429 ``overloaded_error``, its HTTP ``rate_limit_error``;
    OpenAI's streams called every error ``server_error``)."""
    make, read = WRITERS[protocol]
    for status in STATUSES:
        got = read(make(_prep()).error(APIError(status, "boom")))
        assert got == _http_type(protocol, status), status


# ---- the engine killed mid-stream ------------------------------------------------------

LONG = {
    "type": "object",
    "properties": {"n": {"type": "array", "items": {"type": "integer"}, "minItems": 300}},
    "required": ["n"],
}
ASK = "List three hundred numbers."
MAX = 1500


def _bodies() -> dict[str, tuple[str, dict[str, Any]]]:
    user = [{"role": "user", "content": ASK}]
    return {
        "openai_chat": (
            "/v1/chat/completions",
            {
                "messages": user,
                "max_tokens": MAX,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "numbers", "schema": LONG},
                },
            },
        ),
        "openai_completions": (
            "/v1/completions",
            {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": MAX},
        ),
        "openai_responses": (
            "/v1/responses",
            {
                "input": ASK,
                "max_output_tokens": MAX,
                "text": {"format": {"type": "json_schema", "name": "numbers", "schema": LONG}},
            },
        ),
        "anthropic_messages": (
            "/v1/messages",
            {
                "messages": user,
                "max_tokens": MAX,
                "output_config": {"format": {"type": "json_schema", "schema": LONG}},
            },
        ),
    }


def _id_of(protocol: str, name: str | None, data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    if protocol == "openai_responses" and name == "response.created":
        return data["response"]["id"]
    if protocol == "anthropic_messages" and name == "message_start":
        return data["message"]["id"]
    if protocol.startswith("openai_") and "choices" in data:
        return data["id"]
    return None


def _generated(protocol: str, name: str | None, data: Any) -> bool:
    """The event carries generated text."""
    if not isinstance(data, dict):
        return False
    if protocol == "openai_chat":
        return any(c["delta"].get("content") for c in data.get("choices") or [])
    if protocol == "openai_completions":
        return any(c.get("text") for c in data.get("choices") or [])
    if protocol == "openai_responses":
        return name == "response.output_text.delta"
    return name == "content_block_delta"


class _Client(threading.Thread):
    """One stream: reads until generated text arrives (``ready``), then to its end."""

    def __init__(self, url: str, key: str, protocol: str, path: str, body: dict[str, Any]):
        super().__init__(daemon=True)
        self.args = (url + path, key, {**body, "model": "m", "stream": True})
        self.protocol = protocol
        self.ready = threading.Event()
        self.events: list[tuple[str | None, Any]] = []
        self.id: str | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        url, key, body = self.args
        try:
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as r:
                assert r.status_code == 200, r.read()
                name = None
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                        self.events.append((name, data))
                        self.id = self.id or _id_of(self.protocol, name, data)
                        if _generated(self.protocol, name, data):
                            self.ready.set()
                        name = None
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.failure = e
        finally:
            self.ready.set()


def _stream_error_type(protocol: str, events: list[tuple[str | None, Any]]) -> str:
    """The stream's last events are its error then terminator; the error's type."""
    if protocol in ("openai_chat", "openai_completions"):
        (_, err), (_, done) = events[-2:]
        assert done == "[DONE]", events[-3:]
        return err["error"]["type"]
    name, data = events[-1]
    if protocol == "openai_responses":
        assert name == "response.failed", events[-3:]
        return data["response"]["error"]["code"]
    assert name == "error" and data["type"] == "error", events[-3:]
    return data["error"]["type"]


def _http_error_type(protocol: str, r: httpx.Response) -> str:
    body = r.json()
    return body["error"]["type"]


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (SGLang's scheduler and detokenizer)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _kill_mid_stream(stack: Stack, kill: Callable[[], None]) -> None:
    key = stack.key()
    clients = {
        protocol: _Client(stack.gw.url, key, protocol, path, body)
        for protocol, (path, body) in _bodies().items()
    }
    for c in clients.values():
        c.start()
    for c in clients.values():
        assert c.ready.wait(600), c.protocol
        assert c.failure is None, (c.protocol, c.failure)
    kill()
    for c in clients.values():
        c.join(120)
        assert not c.is_alive(), c.protocol
        assert c.failure is None, (c.protocol, c.failure)

    with httpx.Client(timeout=60) as http:
        for protocol, c in clients.items():
            kind = _stream_error_type(protocol, c.events)
            path, body = _bodies()[protocol]
            r = http.post(
                stack.gw.url + path,
                json={**body, "model": "m"},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 503, r.text
            assert kind == _http_error_type(protocol, r), protocol  # the one table
    ids = [c.id for c in clients.values()]
    assert all(ids), ids
    for rec in wait_recorded(stack, ids, timeout=60):  # type: ignore[arg-type]
        assert rec.finish_reason == "abort" and rec.completion_token_ids, rec.id


@pytest.fixture
def sqlite_stack(tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    db_url = f"sqlite:///{tmp_path / 'rlgate.db'}"
    upgrade(db_url)
    db_engine = make_engine(db_url)
    yield db_url, session_factory(db_engine), tmp_path
    db_engine.dispose()


def test_engine_killed_mid_stream_embedded(sqlite_stack: tuple[str, Any, Path]) -> None:
    db_url, factory, tmp = sqlite_stack
    port = free_port()
    args = ("--context-length", "2048", "--max-running-requests", "8")
    with (
        running(engine_cmd(port, *args), {}, tmp / "engine.log", port) as eng,
        in_process_gateway(tmp / "gw", db_url, eng.url) as gw,
    ):
        stack = Stack(gw, eng, db_url, factory, tmp)
        _kill_mid_stream(stack, lambda: eng.kill(signal.SIGKILL))


def test_engine_killed_mid_stream_sglang(sqlite_stack: tuple[str, Any, Path]) -> None:
    from tests.sglang import sglang_server

    db_url, factory, tmp = sqlite_stack
    with (
        sglang_server(tmp / "sglang.log") as eng,
        in_process_gateway(tmp / "gw", db_url, eng.url, engine_api_key=eng.api_key) as gw,
    ):
        stack = Stack(gw, eng, db_url, factory, tmp)  # type: ignore[arg-type]
        _kill_mid_stream(stack, lambda: _kill_tree(eng.pid))
