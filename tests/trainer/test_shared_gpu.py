"""One GPU shared by an engine and training (trainer/shared_gpu.py): the calls an engine
gets around a run, in order and with the engine key, over real HTTP to a fake engine
that answers as SGLang 0.5.23 does (a 200 with ``null`` for the memory calls, a 400
with its error for a refusal). Real SGLang's release needs a GPU and
--enable-memory-saver: scripts/device_check.sh runs it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from core.settings import Settings
from trainer.shared_gpu import SharedGPUError, engines_released


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str | None]] = []
        self.refuse: set[str] = set()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                engine.calls.append((self.path, body, self.headers.get("Authorization")))
                if self.path in engine.refuse:
                    self._answer(400, {"error": {"message": "memory saver is not enabled"}})
                elif self.path in ("/pause_generation", "/continue_generation"):
                    self._answer(200, {"message": "ok", "status": "ok"})
                else:
                    self._answer(200, None)

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine()
    yield e
    e.server.shutdown()


def _settings(engine: FakeEngine, shared: str | None = None) -> Settings:
    return Settings(
        engine_urls=engine.url,
        train_shared_gpu_engines=engine.url if shared is None else shared,
        engine_api_key="k3y",
    )


def test_an_engine_pauses_releases_then_resumes_and_continues(engine: FakeEngine) -> None:
    with engines_released(_settings(engine)) as released:
        assert released == [engine.url]
        assert engine.paths() == ["/pause_generation", "/release_memory_occupation"]
    assert engine.paths() == [
        "/pause_generation",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/continue_generation",
    ]
    assert [c[1] for c in engine.calls] == [{"mode": "retract"}, {}, {}, {}]
    assert {c[2] for c in engine.calls} == {"Bearer k3y"}


def test_a_failed_run_still_gives_the_memory_back(engine: FakeEngine) -> None:
    with pytest.raises(RuntimeError, match="out of memory"), engines_released(_settings(engine)):
        raise RuntimeError("out of memory")
    assert engine.paths()[-2:] == ["/resume_memory_occupation", "/continue_generation"]


def test_an_engine_that_refuses_fails_the_run_before_training(engine: FakeEngine) -> None:
    engine.refuse.add("/release_memory_occupation")
    trained = []
    with (
        pytest.raises(SharedGPUError, match="--enable-memory-saver"),
        engines_released(_settings(engine)),
    ):
        trained.append(1)
    assert not trained
    # generation goes on; nothing was released, so nothing is resumed
    assert engine.paths() == [
        "/pause_generation",
        "/release_memory_occupation",
        "/continue_generation",
    ]


def test_a_resume_refused_fails_loudly(engine: FakeEngine) -> None:
    engine.refuse.add("/resume_memory_occupation")
    with pytest.raises(SharedGPUError, match="did not resume"), engines_released(_settings(engine)):
        pass


def test_only_the_configured_engines_are_asked(engine: FakeEngine) -> None:
    with engines_released(_settings(engine, shared="")) as released:
        assert released == []
    with (
        pytest.raises(SharedGPUError, match="not among the engines"),
        engines_released(_settings(engine, shared="http://10.9.9.9:30000")),
    ):
        pass
    assert engine.calls == []
