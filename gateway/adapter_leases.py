"""Which adapters the requests in flight hold (``Leases``): an old version is unloaded
from the engines only when no request of this gateway still uses it."""

from __future__ import annotations

import asyncio
from collections import defaultdict


class Leases:
    """Requests in flight per adapter name; an unload of a version waits for zero."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self._cond = asyncio.Condition()

    async def acquire(self, name: str) -> None:
        async with self._cond:
            self.counts[name] += 1

    async def release(self, name: str) -> None:
        async with self._cond:
            self.counts[name] -= 1
            if self.counts[name] <= 0:
                del self.counts[name]
            self._cond.notify_all()

    async def wait_released(self, name: str, timeout: float = 600.0) -> None:
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: self.counts.get(name, 0) == 0), timeout
            )
