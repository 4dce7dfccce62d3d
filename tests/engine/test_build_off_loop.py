"""The embedded engine builds a ``/generate`` call's requests (tokenizing text prompts,
compiling grammars: a constraint per choice) on a thread, not on its event loop
(engine/server.py ``_build_off_loop``); a call cancelled meanwhile (its client left) still
releases the adapters the build acquired. A stand-in for ``Engine`` records where the
build ran and what was released."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from engine.server import _build_off_loop


class _Engine:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.built_on: list[str] = []
        self.released: list[Any] = []

    def build_requests(self, items: list[Any], stream: bool, text_in_logprobs: bool) -> list[Any]:
        self.built_on.append(threading.current_thread().name)
        time.sleep(self.seconds)
        return [f"req-{i}" for i in items]

    def release(self, requests: list[Any]) -> None:
        self.released += requests


class _Body:
    stream = False
    return_text_in_logprobs = False


def test_the_build_runs_on_a_thread_and_the_loop_keeps_running() -> None:
    async def main() -> tuple[list[Any], int]:
        engine = _Engine(0.3)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        reqs = await _build_off_loop(engine, [0, 1], _Body())  # type: ignore[arg-type]
        ticker.cancel()
        assert engine.built_on and engine.built_on[0] != threading.main_thread().name
        return reqs, ticks

    reqs, ticks = asyncio.run(main())
    assert reqs == ["req-0", "req-1"]
    assert ticks >= 5  # the loop ran while the build did (one tick per 10 ms of 300)


def test_a_cancelled_call_releases_what_its_build_acquired() -> None:
    async def main() -> _Engine:
        engine = _Engine(0.2)
        call = asyncio.create_task(_build_off_loop(engine, [0, 1, 2], _Body()))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        call.cancel()
        try:
            await call
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the call was not cancelled")
        await asyncio.sleep(0.4)  # the build returns; its requests are released
        return engine

    engine = asyncio.run(main())
    assert engine.released == ["req-0", "req-1", "req-2"]
