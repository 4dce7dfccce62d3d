"""Commit tickets: how a request learns that the records it handed the recorder are in the
database, so its answer (the JSON body, or a stream's last event) is released only then.

Every id an answer names (interaction, group, session, response) is then readable by any
gateway process on the same database the moment the client has it. The recorder
(gateway.recording.recorder) issues one :class:`Ticket` per ``record()`` call; its writer thread
counts the ticket's records off as their batch commits (a record refused for its content
counts too: it went to the dead letters and is never coming). While the database is
unreachable every open ticket, and each new one, is settled at once as not committed:
the records stay safe in the spool and the answer is not held back. Settling crosses
from the writer thread to the request's event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable


class Ticket:
    """The commit of one ``record()`` call's records."""

    def __init__(self, records: int, loop: asyncio.AbstractEventLoop) -> None:
        self.left = records
        self.loop = loop
        self.future: asyncio.Future[bool] = loop.create_future()

    def settle(self, committed: bool) -> None:
        """Resolve the waiting request (from any thread); the first settlement wins."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self._set, committed)

    def _set(self, committed: bool) -> None:
        if not self.future.done():
            self.future.set_result(committed)

    async def wait(self, timeout: float) -> bool | None:
        """True once committed, False when the database is unreachable (the records are
        in the spool), None when ``timeout`` seconds passed first."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.future), timeout)
        except TimeoutError:
            return None


class Tickets:
    """The tickets whose records are not all committed yet (thread-safe)."""

    def __init__(self) -> None:
        self._open: set[Ticket] = set()
        self._lock = threading.Lock()

    def issue(self, records: int) -> Ticket:
        """A ticket for ``records`` records, for the running event loop."""
        ticket = Ticket(records, asyncio.get_running_loop())
        with self._lock:
            self._open.add(ticket)
        return ticket

    def drop(self, ticket: Ticket) -> None:
        """Forget a ticket whose records were never accepted (the spool write failed)."""
        with self._lock:
            self._open.discard(ticket)

    def written(self, tickets: Iterable[Ticket | None]) -> None:
        """One record of each of ``tickets`` (one entry per record, None for records
        without a ticket) is in the database, or in the dead letters."""
        done = []
        with self._lock:
            for t in tickets:
                if t is None:
                    continue
                t.left -= 1
                if t.left <= 0:
                    self._open.discard(t)
                    done.append(t)
        for t in done:
            t.settle(True)

    def release_all(self) -> None:
        """The database is unreachable: answer every waiting request now (not committed).
        The tickets stay open, so their records are still counted off later."""
        with self._lock:
            waiting = list(self._open)
        for t in waiting:
            t.settle(False)

    def __len__(self) -> int:
        return len(self._open)
