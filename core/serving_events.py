"""Notices that a project's serving version changed, so that every gateway sees a switch
at once rather than when its cached pointer expires (RLGATE_SERVING_CACHE_S).

On PostgreSQL, :func:`announce` queues a ``pg_notify`` on the channel ``rlgate_serving``
inside the transaction that switches the pointer (trainer/publish.py ``switch_serving``):
PostgreSQL delivers it at commit, and never for a switch that rolled back. Each gateway
runs a :class:`Listener` on a connection of its own and drops that project's cached
pointer when a notice arrives. A listener that lost its connection reconnects and then
reports every project as changed, since it may have missed notices.

SQLite has no such channel: there the announcement is a no-op and a gateway re-reads the
pointer when its cache expires.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

CHANNEL = "rlgate_serving"
EVERY_PROJECT = ""  # the payload a listener reports after a reconnect

log = logging.getLogger("rlgate.serving")


def announce(db: Session, project_id: str) -> None:
    """Queue the notice that ``project_id``'s serving version changed; sent when ``db``'s
    transaction commits (PostgreSQL only)."""
    if db.get_bind().dialect.name == "postgresql":
        notice = {"channel": CHANNEL, "project": project_id}
        db.execute(text("SELECT pg_notify(:channel, :project)"), notice)


def listens(database_url: str) -> bool:
    """Whether notices can reach a gateway on this database."""
    return make_url(database_url).get_backend_name() == "postgresql"


class Listener:
    """A thread that calls ``changed(project_id)`` for each notice (``EVERY_PROJECT``
    after it had to reconnect)."""

    def __init__(self, database_url: str, changed: Callable[[str], None]) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self.dsn = url.render_as_string(hide_password=False)
        self.changed = changed
        self.ready = threading.Event()  # set once LISTEN is in place
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlgate-notices", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 0.5
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if not first:  # notices may have gone by while we were away
                        self.changed(EVERY_PROJECT)
                    first, backoff = False, 0.5
                    self.ready.set()
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self.changed(notice.payload)
            except psycopg.Error as e:
                log.warning("serving notices: %s; reconnecting in %.1f s", e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
