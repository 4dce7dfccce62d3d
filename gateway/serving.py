"""Which adapter serves a project (``ServingPolicy``, cached briefly; on PostgreSQL a
switch drops the cached pointer at once, core/serving_events.py) and which adapters
requests in flight hold (``Leases``: an old version is unloaded only when none does)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN, STALE_IF_DOWN_S
from gateway.errors import db_down_error
from schemas.atdp import PolicyStatus
from schemas.tables import PolicyVersionRow


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


class ServingPolicy:
    """Which adapter serves a project now (``policy_versions.status == 'serving'``)."""

    def __init__(self, factory: sessionmaker[Session], ttl_s: float = 0.5) -> None:
        self.ttl_s = ttl_s
        self.factory = factory
        self._cache: dict[str, tuple[float, str | None]] = {}

    def invalidate(self) -> None:
        self._cache.clear()

    def forget(self, project_id: str) -> None:
        """Drop one project's cached pointer (every project's for ``""``); called from the
        thread of core/serving_events.py's listener when the serving version changed."""
        if project_id:
            self._cache.pop(project_id, None)
        else:
            self._cache.clear()

    def cached(self, project_id: str) -> tuple[bool, str | None]:
        """(fresh, adapter) from the cache alone, for the hot path."""
        hit = self._cache.get(project_id)
        if hit and time.monotonic() - hit[0] < self.ttl_s:
            return True, hit[1]
        return False, None

    def adapter_for(self, project_id: str) -> str | None:
        now = time.monotonic()
        hit = self._cache.get(project_id)
        if hit and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            with self.factory() as db:
                name = db.scalars(
                    select(PolicyVersionRow.name)
                    .where(
                        PolicyVersionRow.project_id == project_id,
                        PolicyVersionRow.status == PolicyStatus.serving,
                    )
                    .order_by(PolicyVersionRow.version.desc())
                    .limit(1)
                ).first()
        except DB_DOWN:  # keep serving the version last read while the database is down
            if hit and now - hit[0] < STALE_IF_DOWN_S:
                return hit[1]
            raise db_down_error() from None
        self._cache[project_id] = (now, name)
        return name
