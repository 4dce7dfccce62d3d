"""Which adapters the requests in flight hold (``Leases``): every generation of the
pipeline (gateway/call/pipeline.py) holds a lease on its adapter from the engine call to its
last token. Two readers: a background unload of a replaced version waits for its count
to reach zero (gateway/engines/unloads.py), and the adapter sync never unloads a retired version
this gateway still has requests on (gateway/engines/adapter_sync.py)."""

from __future__ import annotations

import asyncio
from collections import defaultdict


class Leases:
    """Requests in flight per adapter name; an unload of a version waits for zero."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self._cond = asyncio.Condition()

    def count(self, name: str) -> int:
        """Requests in flight on ``name`` now."""
        return self.counts.get(name, 0)

    async def acquire(self, name: str) -> None:
        async with self._cond:
            self.counts[name] += 1

    async def release(self, name: str) -> None:
        async with self._cond:
            self.counts[name] -= 1
            if self.counts[name] <= 0:
                del self.counts[name]
            self._cond.notify_all()

    async def wait_released(self, name: str, timeout: float) -> bool:
        """Wait until no request holds ``name``; False if some still do after
        ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                async with self._cond:
                    await self._cond.wait_for(lambda: self.counts.get(name, 0) == 0)
        except TimeoutError:
            return False
        return True
