"""The gateway's cached pointer to the adapter that serves each project (``ServingPolicy``):
read from the database (core/serving_version.py) at most every ``ttl_s``; on PostgreSQL a
switch drops the cached pointer at once (core/serving_events.py)."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN, STALE_IF_DOWN_S
from core.serving_version import serving_version
from gateway.edge.errors import db_down_error


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
                row = serving_version(db, project_id)
                name = row.name if row is not None else None
        except DB_DOWN:  # keep serving the version last read while the database is down
            if hit and now - hit[0] < STALE_IF_DOWN_S:
                return hit[1]
            raise db_down_error() from None
        self._cache[project_id] = (now, name)
        return name
