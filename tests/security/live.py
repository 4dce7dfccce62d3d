"""A live gateway on PostgreSQL with the real embedded engine, for the security tests (the
engine, model and database fixtures are tests/gateway/conftest.py's). The gateway app is
served in this process (tests/gateway/fake_engine.py in_process_gateway): these tests are
about what it answers, not about its process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.gateway.fake_engine import in_process_gateway


@dataclass
class Live:
    url: str
    factory: Any

    def key(self, kind: str = "agent", project: str = "p1") -> str:
        with transaction(self.factory) as db:
            _, secret = create_key(db, project, kind)
        return secret


@contextmanager
def pg_gateway(data_dir: Path, db_url: str, engine_url: str, **settings: str) -> Iterator[Live]:
    """A gateway on the (migrated) PostgreSQL database ``db_url``."""
    upgrade(db_url)
    db = make_engine(db_url)
    try:
        with in_process_gateway(data_dir, db_url, engine_url, **settings) as gw:
            yield Live(gw.url, session_factory(db))
    finally:
        db.dispose()
