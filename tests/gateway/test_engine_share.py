"""A fair share of the engines (issue 36, finding 7; gateway/engines/engine_share.py): one project
that fills an engine's in-flight slots cannot keep another project waiting behind its
backlog. Each engine request holds a slot (a Completions call of prompts x n holds that
many); when all are held, requests wait in their project's queue and each freed slot goes
to the waiting project holding the fewest.

First ``FairSlots`` alone, then the fast in-process tier (the real gateway before a fake
engine that holds every request until the test releases it,
tests/gateway/fake_engine.py): p1 fills the engine's 2 slots and queues more; p2's call,
sent after p1's backlog, reaches the engine with the first slot that frees. Assertions
are on the order requests reach the engine, never on wall-clock time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings
from gateway.engines.engine_share import FairSlots
from tests.gateway.fake_engine import FastStack, fast_stack

pytestmark = pytest.mark.timeout(300)

# ---- FairSlots --------------------------------------------------------------------------


def test_alone_a_project_uses_every_slot_then_waits_or_is_refused() -> None:
    async def main() -> None:
        slots = FairSlots(3)
        assert [await slots.acquire("p1", 0) for _ in range(3)] == [True] * 3
        assert not await slots.acquire("p1", 0)  # no wait allowed: refused at once
        assert not await slots.acquire("p1", 0.05)  # nothing freed in time
        assert slots.waiting == 0 and slots.in_flight == 3
        later = asyncio.create_task(slots.acquire("p1", 5))
        await asyncio.sleep(0)
        slots.release("p1")
        assert await later and slots.held["p1"] == 3

    asyncio.run(main())


def test_a_freed_slot_goes_to_the_project_holding_fewest() -> None:
    async def main() -> None:
        slots = FairSlots(2)
        for _ in range(2):
            assert await slots.acquire("p1", 0)
        order: list[str] = []

        async def call(project: str) -> None:
            assert await slots.acquire(project, 10)
            order.append(project)

        tasks = [asyncio.create_task(call("p1")) for _ in range(3)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(call("p2")))  # queued after p1's backlog
        tasks.append(asyncio.create_task(call("p3")))
        await asyncio.sleep(0.01)
        assert slots.waiting == 5 and not slots.has_room()
        # each holder in turn finishes: p1's two first, then p2's, p3's, p1's
        for holder in ("p1", "p1", "p2", "p3", "p1"):
            slots.release(holder)
            await asyncio.sleep(0.01)
        # p2 and p3 (holding none) first, although p1 held none either at the second
        # release: p1 took a slot more recently; then p1's backlog
        assert order == ["p2", "p3", "p1", "p1", "p1"]
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_a_cancelled_wait_leaves_no_slot_behind() -> None:
    async def main() -> None:
        slots = FairSlots(1)
        assert await slots.acquire("p1", 0)
        waiter = asyncio.create_task(slots.acquire("p2", 10))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert slots.waiting == 0
        slots.release("p1")
        assert slots.in_flight == 0 and slots.has_room()

    asyncio.run(main())


def test_one_key_cannot_fill_an_engine_by_default() -> None:
    s = Settings()
    assert s.max_concurrent_per_key < s.max_in_flight_per_engine


# ---- the gateway before a fake engine ----------------------------------------------------

P1_TOKENS, P2_TOKENS = 5, 7  # tells the engine whose request it got


@pytest.fixture(scope="module")
def fast(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastStack]:
    settings = {"max_in_flight_per_engine": 2, "engine_queue_wait_s": 120.0}
    with fast_stack(tmp_path_factory.mktemp("share"), model_dir, **settings) as stack:
        yield stack


def _chat(tokens: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _p1_backlog_chats(fast: FastStack, pool: ThreadPoolExecutor) -> list[Future]:
    return [pool.submit(fast.post, "/v1/chat/completions", _chat(P1_TOKENS)) for _ in range(6)]


def _p1_backlog_batch(fast: FastStack, pool: ThreadPoolExecutor) -> list[Future]:
    """One Completions call of 3 prompts x n=2: six engine requests, six slots."""
    body = {"model": "m", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": P1_TOKENS}
    return [pool.submit(fast.post, "/v1/completions", body)]


@pytest.mark.parametrize("backlog", [_p1_backlog_chats, _p1_backlog_batch], ids=["calls", "batch"])
def test_another_projects_call_gets_the_next_free_slot(
    fast: FastStack, backlog: Callable[[FastStack, ThreadPoolExecutor], list[Future]]
) -> None:
    engine = fast.engine
    share = fast.app.state.gw.engines.slots[0].share
    start = len(engine.arrivals)
    engine.hold()
    with ThreadPoolExecutor(8) as pool:
        p1 = backlog(fast, pool)
        # p1 holds both slots and has 4 requests waiting at the gateway
        engine.wait_arrivals(start + 2)
        _wait(lambda: share.waiting == 4, f"p1's backlog did not queue ({share.waiting})")
        p2 = pool.submit(fast.post, "/v1/chat/completions", _chat(P2_TOKENS), "p2")
        _wait(lambda: share.waiting == 5, "p2's call did not queue")
        engine.release(1)  # one of p1's requests finishes: its slot goes to p2
        arrived = engine.wait_arrivals(start + 3)
        tokens = [a["sampling_params"]["max_new_tokens"] for a in arrived[start:]]
        assert tokens == [P1_TOKENS, P1_TOKENS, P2_TOKENS], tokens
        assert share.waiting == 4  # p1's backlog: all of it still waiting
        engine.open()
        answers = [f.result() for f in [*p1, p2]]
    assert [r.status_code for r in answers] == [200] * len(answers), answers[-1].text[:300]
    assert share.in_flight == 0 and share.waiting == 0
