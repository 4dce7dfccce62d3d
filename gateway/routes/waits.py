"""Waiting for an id the client just got but the database may not hold yet, without
holding a worker thread.

The recorder commits asynchronously, so an interaction id (feedback, ``/rl/set_reward``)
or a response id (``previous_response_id``) can arrive before its row. :func:`locate`:

1. if this process's recorder still holds a record with that id, waits for the commit
   by sleeping on the event loop (an in-memory check, no database) for up to
   ``PENDING_WAIT_S``;
2. looks the id up in the database once (one short thread hop);
3. if it is still missing, it may be being recorded by another replica: it is looked up
   again every ``POLL_S`` seconds for up to ``RLGATE_UNKNOWN_ID_WAIT_S`` (default 0.5 s),
   sleeping on the event loop between lookups. A key may have at most
   ``RLGATE_WAITS_PER_KEY`` such waits at once; past that an unknown id is answered at
   once (the caller turns None into its 404).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from fastapi import Request

from gateway.routes.request_context import gw_of

T = TypeVar("T")

PENDING_WAIT_S = 2.0  # how long a record this process holds may take to commit
POLL_S = 0.1


class WaitSlots:
    """How many unknown-id waits each key has running (one event loop: no lock)."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self.held: dict[str, int] = {}

    @contextmanager
    def slot(self, key_id: str) -> Iterator[bool]:
        """Yields True with a slot held, False when the key has all of its slots."""
        n = self.held.get(key_id, 0)
        if n >= self.per_key:
            yield False
            return
        self.held[key_id] = n + 1
        try:
            yield True
        finally:
            left = self.held[key_id] - 1
            if left:
                self.held[key_id] = left
            else:
                del self.held[key_id]


def slots_of(request: Request) -> WaitSlots:
    state = request.app.state
    slots = getattr(state, "wait_slots", None)
    if slots is None:
        slots = WaitSlots(gw_of(request).settings.waits_per_key)
        state.wait_slots = slots
    return slots


async def until_committed(recorder: Any, ref: str | None, timeout: float = PENDING_WAIT_S) -> None:
    """Sleep (on the event loop) while this process's recorder holds a record with id
    ``ref`` (any record when ``ref`` is None), for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _busy(recorder, ref):
            return
        await asyncio.sleep(0.02)


def _busy(recorder: Any, ref: str | None) -> bool:
    is_pending = getattr(recorder, "is_pending", None)
    if is_pending is None:  # a recorder without per-id tracking: anything queued counts
        return recorder.pending > 0
    return bool(recorder.has_pending if ref is None else is_pending(ref))


async def locate(
    request: Request, key_id: str, ref: str, lookup: Callable[[], T | None]
) -> T | None:
    """What ``lookup`` (a synchronous database read, run in a thread) finds for ``ref``
    once it is committed, or None if it is neither stored nor being recorded."""
    gw = gw_of(request)
    await until_committed(gw.recorder, ref)
    found = await asyncio.to_thread(lookup)
    wait_s = gw.settings.unknown_id_wait_s
    if found is not None or wait_s <= 0:
        return found
    with slots_of(request).slot(key_id) as ok:
        if not ok:
            return None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            await until_committed(gw.recorder, ref)
            found = await asyncio.to_thread(lookup)
            if found is not None:
                return found
    return None
