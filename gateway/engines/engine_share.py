"""One engine's in-flight slots, shared fairly between projects.

An engine takes at most ``limit`` requests from this gateway at once
(RLGATE_MAX_IN_FLIGHT_PER_ENGINE); each engine request holds one slot, so a Completions
call of 16 prompts x n=8 holds 128 (as many as it sends). While a slot is free and
nobody waits, a request takes it at once. When all are held, a request waits in its
project's queue, and each slot that is freed goes to the waiting project that holds the
fewest slots (ties: the one that took a slot least recently). So a project that fills
the engine keeps only what it already holds, and while another project waits it gets no new slot
until the other has as many: its backlog waits behind the newcomer's first request
instead of in front of it. A request that waits longer than the queue's time limit
(RLGATE_ENGINE_QUEUE_WAIT_S; 0: never wait) is refused (the caller answers 429).

Alone, a project may use every slot: the share only applies while others wait. The
share is of the gateway's slots: an engine queues what it takes beyond its running batch
first come, first served, so RLGATE_MAX_IN_FLIGHT_PER_ENGINE near the engine's batch
(SGLang's and the embedded engine's ``--max-running-requests``) keeps the waiting here,
where it is fair. Slots are per gateway process: replicas share an engine unaware of
each other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque


class FairSlots:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: Counter[str] = Counter()  # project -> slots it holds
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # oldest first
        self._ticks = 0
        self._last: dict[str, int] = {}  # project -> when it last took a slot

    @property
    def in_flight(self) -> int:
        return sum(self.held.values())

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def has_room(self) -> bool:
        """A request may take a slot now: one is free and nobody waits for it."""
        return self.in_flight < self.limit and not self._waiting

    def take(self, project: str) -> None:
        """Take a slot whether or not one is free (failover to the next engine of a
        request whose first engine could not be reached)."""
        self.held[project] += 1
        self._ticks += 1
        self._last[project] = self._ticks

    async def acquire(self, project: str, wait_s: float) -> bool:
        """A slot for ``project``: at once if ``has_room``, else after waiting in its
        project's queue for at most ``wait_s`` seconds. False: none came in time."""
        if self.has_room():
            self.take(project)
            return True
        if wait_s <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(project, deque()).append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), wait_s)
            return True
        except TimeoutError:
            if fut.done():  # handed over as the wait ran out: the slot is ours
                return True
            self._forget(project, fut)
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(project)  # handed over, but its request is gone
            else:
                self._forget(project, fut)
            raise

    def release(self, project: str) -> None:
        """Give a slot back; it goes to the next waiting request, if any."""
        self.held[project] -= 1
        if self.held[project] <= 0:
            del self.held[project]
            if project not in self._waiting:
                self._last.pop(project, None)
        self._hand_over()

    def _forget(self, project: str, fut: asyncio.Future[None]) -> None:
        fut.cancel()
        q = self._waiting.get(project)
        if q is not None:
            with contextlib.suppress(ValueError):
                q.remove(fut)
            if not q:
                del self._waiting[project]

    def _hand_over(self) -> None:
        while self._waiting and self.in_flight < self.limit:
            # the fewest held; among those, the one that took a slot least recently
            project = min(self._waiting, key=lambda p: (self.held[p], self._last.get(p, 0)))
            q = self._waiting[project]
            fut = q.popleft()
            if not q:
                del self._waiting[project]
            if fut.done():
                continue
            self.take(project)
            fut.set_result(None)
