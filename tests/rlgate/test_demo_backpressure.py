"""The demo honours backpressure and never ends without its curve.

A tiny HTTP server (uvicorn on a free port) plays the gateway: it answers 429 or 503,
with ``Retry-After`` or without, a few times before it answers. The demo's own clients
(rlgate/demo_agents.py, rlgate/demo_http.py) talk to it over real HTTP. The retry waits
go through ``rlgate.demo_http._sleep``, recorded here (and not slept), so the test checks
which delays were honoured without measuring time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from click.testing import CliRunner
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlgate import demo_http
from rlgate.cli import main
from rlgate.demo import evaluate, serving
from rlgate.demo_agents import ArithmeticAgent
from tests.servers import MODEL_CACHE, free_port


@dataclass
class Script:
    """What the fake gateway answers: ``refuse[path]`` backpressure answers, in order,
    before each path is served; past ``chat_ok`` served chats every chat is a 429."""

    refuse: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)
    chat_ok: int | None = None
    seen: list[tuple[str, int]] = field(default_factory=list)
    served_chats: int = 0


def _app(script: Script) -> FastAPI:
    app = FastAPI()

    def backpressure(path: str) -> JSONResponse | None:
        queue = script.refuse.get(path) or []
        if queue:
            status, after = queue.pop(0)
            headers = {"Retry-After": after} if after is not None else {}
            script.seen.append((path, status))
            body = {"error": {"message": "all engines are at their in-flight limit"}}
            return JSONResponse(body, status_code=status, headers=headers)
        return None

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        refused = backpressure("chat")
        if refused is None and script.chat_ok is not None and script.served_chats >= script.chat_ok:
            script.seen.append(("chat", 429))
            refused = JSONResponse(
                {"error": {"message": "all engines are at their in-flight limit"}},
                status_code=429,
                headers={"Retry-After": "1"},
            )
        if refused is not None:
            return refused
        body = await request.json()
        script.served_chats += 1
        script.seen.append(("chat", 200))
        n = body.get("n") or 1
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": "5"},
                "finish_reason": "stop",
                "logprobs": None,
            }
            for i in range(n)
        ]
        return JSONResponse(
            {
                "id": f"chatcmpl-{script.served_chats}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "rlgate-policy",
                "choices": choices,
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
            },
            headers={"X-Rlgate-Policy-Version": "v7"},
        )

    @app.get("/admin/api/adapters")
    async def adapters() -> JSONResponse:
        refused = backpressure("adapters")
        if refused is not None:
            return refused
        script.seen.append(("adapters", 200))
        return JSONResponse({"items": [{"name": "v7", "status": "serving"}]})

    @app.post("/feedback")
    async def feedback() -> JSONResponse:
        refused = backpressure("feedback")
        if refused is not None:
            return refused
        script.seen.append(("feedback", 200))
        return JSONResponse({"object": "feedback"})

    return app


@pytest.fixture
def fake_gateway() -> Iterator[tuple[str, Script]]:
    script = Script()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(_app(script), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the fake gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", script
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retry delays the demo asked for (they are not slept)."""
    asked: list[float] = []

    async def record(delay: float) -> None:
        asked.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(demo_http, "_sleep", record)
    return asked


def test_an_evaluation_that_meets_429s_completes(fake_gateway, waits):
    base, script = fake_gateway
    script.refuse = {
        "chat": [(429, "2"), (429, "2"), (503, None), (429, "3")],
        "adapters": [(503, "1")],
        "feedback": [(429, "1")],
    }

    async def run() -> tuple[tuple[str, float], str, list[bool]]:
        agent = ArithmeticAgent(base, "agent-key", 0, 2, [(2, 3)])
        try:
            result = await evaluate(agent, [(2, 3)] * 6, 3)
            now = await serving(agent, "admin-key", "base")
            right = await agent.train_round()  # n=2 answers, each rated
            return result, now, right
        finally:
            await agent.http.aclose()
            await agent.client.close()

    (version, accuracy), now, right = asyncio.run(run())
    assert (version, accuracy) == ("v7", 1.0)  # every question answered, none lost
    assert now == "v7" and right == [True, True]
    refused = [s for s in script.seen if s[1] != 200]
    assert refused == [
        ("chat", 429),
        ("chat", 429),
        ("chat", 503),
        ("chat", 429),
        ("adapters", 503),
        ("feedback", 429),
    ]
    assert script.served_chats == 7
    # Retry-After honoured where given; the 503 without one waited the backoff
    assert sorted(waits) == sorted([2.0, 2.0, demo_http.FIRST_DELAY_S, 3.0, 1.0, 1.0])


def test_retry_after_as_seconds_or_date_and_bounded():
    assert demo_http.retry_after("7", 0.5) == 7.0
    assert demo_http.retry_after("9999", 0.5) == demo_http.MAX_DELAY_S
    assert demo_http.retry_after(None, 4.0) == 4.0
    assert demo_http.retry_after("soon", 4.0) == 4.0
    assert demo_http.retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 4.0) == 0.0  # past


def test_a_failing_run_writes_its_curve_and_exits_with_one_line(
    fake_gateway, waits, tmp_path, monkeypatch
):
    """The base evaluation is answered; then the fake gateway refuses every call with 429
    (beyond the retry bound). The run writes curve.json and curve.png of the point it
    measured and exits 1 with one line saying what failed, no traceback."""
    base, script = fake_gateway
    script.chat_ok = 4  # the base evaluation's four questions
    data = tmp_path / "data"
    (data / "demo").mkdir(parents=True)
    (data / "demo" / "models").symlink_to(MODEL_CACHE / "models")
    out = tmp_path / "out"

    @dataclass
    class FakeStack:
        base: str
        logs: Path = tmp_path

        def check_alive(self) -> None:
            pass

        def stop(self) -> None:
            pass

    def fake_launch(*args: Any, **kwargs: Any) -> FakeStack:
        return FakeStack(base)

    monkeypatch.setattr("rlgate.up.launch", fake_launch)
    monkeypatch.setenv("RLGATE_DATA_DIR", str(data))
    args = ["demo", "--minutes", "5", "--eval-size", "4", "--eval-every", "0"]
    result = CliRunner().invoke(main, [*args, "--concurrency", "2", "--out", str(out)])
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 1, output
    assert "Traceback" not in output
    last = output.strip().splitlines()[-1]
    assert last.startswith("Error: the demo stopped at minute "), output
    assert "RateLimitError" in last and "429" in last and "curve.json" in last, last
    curve = json.loads((out / "curve.json").read_text())
    assert [p["policy_version"] for p in curve["points"]] == ["v7"]
    assert "RateLimitError" in curve["failure"]
    assert (out / "curve.png").stat().st_size > 1000
    # the evaluation that failed was retried up to the bound on each question it asked
    assert script.seen.count(("chat", 429)) >= demo_http.ATTEMPTS
