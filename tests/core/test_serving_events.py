"""core/serving_events.py on PostgreSQL: a committed switch reaches a listener, a rolled
back one never does, and a listener whose connection was cut reconnects and reports every
project as changed (it may have missed notices)."""

from __future__ import annotations

import queue
import time

import psycopg
import pytest
from sqlalchemy import text

from core import serving_events
from core.db import make_engine, session_factory, transaction
from tests.conftest import PG_BASE


def _next(got: queue.Queue[str], timeout: float = 10.0) -> str:
    return got.get(timeout=timeout)


def test_notices_commit_rollback_and_reconnect(pg_url: str) -> None:
    db = make_engine(pg_url)
    factory = session_factory(db)
    got: queue.Queue[str] = queue.Queue()
    listener = serving_events.Listener(pg_url, got.put)
    listener.start()
    try:
        assert listener.ready.wait(10)
        with transaction(factory) as s:
            serving_events.announce(s, "p1")
        assert _next(got) == "p1"

        with pytest.raises(RuntimeError), transaction(factory) as s:
            serving_events.announce(s, "p2")
            raise RuntimeError("the switch failed")
        with transaction(factory) as s:
            serving_events.announce(s, "p3")
        assert _next(got) == "p3"  # p2 never came

        # cut the listener's connection: it comes back and reports every project
        name = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as admin:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND query LIKE 'LISTEN%%'",
                (name,),
            ).fetchall()
        assert cut == [(True,)]
        assert _next(got, 30) == serving_events.EVERY_PROJECT
        deadline = time.monotonic() + 10
        while True:  # the LISTEN is back once a notice gets through
            with transaction(factory) as s:
                serving_events.announce(s, "p4")
            try:
                assert _next(got, 1) == "p4"
                break
            except queue.Empty:
                assert time.monotonic() < deadline
    finally:
        listener.stop()
        db.dispose()


def test_sqlite_has_no_channel(sqlite_url: str) -> None:
    assert not serving_events.listens(sqlite_url)
    factory = session_factory(make_engine(sqlite_url))
    with transaction(factory) as s:
        serving_events.announce(s, "p1")  # a no-op, never an error
        assert s.execute(text("SELECT 1")).scalar() == 1
