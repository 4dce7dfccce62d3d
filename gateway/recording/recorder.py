"""Durable, batched recording of interactions.

The promise: once a response (or the final SSE event) is sent, its record is either
committed in the database or sits in a local append-only spool that is replayed into
the database at start-up and whenever the database is back.

- ``record()`` appends the records to the current spool segment and returns a commit
  ticket (gateway.recording.commits) that settles once they are in the database: the caller
  releases its answer only then. With ``fsync`` (``spool_fsync``) it returns after an
  fdatasync shared by concurrent callers (one disk flush per batch): the record survives
  power loss. Without it (the default) the append is a ``write()`` into the page cache,
  done inline: the record survives the gateway crashing or being killed.
- A writer thread takes records in batches, inserts them in one transaction (skipping
  ids that are already there, so replay is idempotent: ``gateway.recording.record_batch``); the
  records of one ``record()`` call (a call's choices, every prompt of a Completions
  batch) are never split between two transactions (but see refusals below). It then
  marks them done and counts them off their tickets; a segment whose records are all in
  the database is deleted. The turns a commit wrote that follow an earlier turn of their
  session go to ``on_followups_written`` (the next-turn dispatch, gateway/recording/next_turn.py).
- If the database is down the writer keeps the batch and retries with backoff; nothing
  is dropped, and waiting tickets are settled as not committed at once. A batch the
  database refuses for its content (a value too long for its column, a character it
  cannot store, a constraint) is split until the refused record(s) are alone; those go
  to the dead-letter file (gateway.recording.dead_letters) and everything else is written.
- Segments left by a dead process (not locked) are replayed at start-up (a failure
  there is logged, never fatal) and again every ``replay_interval_s`` by a background
  thread; replay skips ids already written, so it is idempotent.
- The backlog (records accepted but not yet in the database) is bounded in bytes:
  ``admit()`` refuses new calls with a 503 while it is over ``backlog_max_bytes``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.errors import APIError
from gateway.recording.commits import Ticket, Tickets
from gateway.recording.dead_letters import DeadLetters, describe, refused_for_content
from gateway.recording.record_batch import Followup, write_batch
from gateway.recording.spool import Pending, Segment, Spool, SpoolRecord, spool_line

log = logging.getLogger("rlgate.recorder")


class Recorder:
    def __init__(
        self,
        factory: sessionmaker[Session],
        spool_dir: Path,
        batch_max: int = 256,
        fsync: bool = True,
        on_sessions_written: Callable[[set[str]], None] | None = None,
        *,
        on_followups_written: Callable[[list[Followup]], None] | None = None,
        dead_letter_path: Path | None = None,
        on_dead_letter: Callable[[], None] | None = None,
        backlog_max_bytes: int = 256 << 20,
        replay_interval_s: float = 60.0,
        lag_alert_s: float = 60.0,
    ) -> None:
        self.on_sessions_written = on_sessions_written
        # after a commit: the turns it wrote that follow an earlier turn (must not block)
        self.on_followups_written = on_followups_written
        self.on_dead_letter = on_dead_letter
        self.factory = factory
        self.spool = Spool(spool_dir, fsync)
        self.dead_letters = DeadLetters(dead_letter_path or spool_dir.parent / "dead_letters.jsonl")
        self.batch_max = batch_max
        self.backlog_max_bytes = backlog_max_bytes
        self.replay_interval_s = replay_interval_s
        self.lag_alert_s = lag_alert_s
        # one item per ``record()`` call: its records are written in one transaction
        self.queue: queue.Queue[list[Pending] | None] = queue.Queue()
        self._appends: queue.Queue[tuple[list[SpoolRecord], Future, Ticket] | None] = queue.Queue()
        self.tickets = Tickets()
        self.recorded_total = 0
        self.backlog_bytes = 0  # spool lines accepted and not yet in the database
        self.pending_records = 0  # records accepted and not yet in the database
        self.oldest_pending: float | None = None
        self._threads: list[threading.Thread] = []
        self._db_ok = threading.Event()
        self._db_ok.set()
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # one writer at a time: writer and replay
        self._size_lock = threading.Lock()
        # ids (interaction, group, session) of records accepted, not committed yet: lets
        # feedback and previous_response_id wait for a just-answered id without the db
        self._refs: dict[str, int] = {}
        self._refs_lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Replay what dead processes left (never fatal: what cannot be written now is
        retried by the replay thread), then start the append, write and replay threads."""
        try:
            replayed = self.replay_orphans()
        except Exception:
            log.exception("replaying spool segments at start-up failed; retried later")
            replayed = 0
        if replayed:
            log.info("replayed %d spooled interactions into the database", replayed)
        for target in (self._append_loop, self._write_loop, self._replay_loop):
            t = threading.Thread(target=target, daemon=True, name=f"rlgate-{target.__name__}")
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._appends.put(None)
        self.queue.put(None)
        for t in self._threads:
            t.join(timeout)
        self.tickets.release_all()
        self.spool.close()

    def replay_orphans(self) -> int:
        """Write the records of segments no live process holds, then delete them.
        Idempotent (ids already in the database are skipped). A segment is kept, for the
        next round, when the database cannot be reached. Returns interactions inserted."""
        total = 0
        for path in self.spool.orphans():
            fh = Spool.claim(path)
            if fh is None:
                continue  # a live gateway owns it, or another one replays it right now
            try:
                lines = fh.read().split(b"\n")
                records: list[SpoolRecord] = []
                for n, line in enumerate(lines):
                    if not line.strip():
                        continue
                    try:
                        records.append(json.loads(line))
                    except ValueError:
                        if n == len(lines) - 1:
                            continue  # a torn last line: its response was never acknowledged
                        raw = line.decode(errors="replace")
                        self._dead_letter({"raw": raw}, "spool line is not JSON")
                done = True
                for i in range(0, len(records), self.batch_max):
                    n_in = self._store(records[i : i + self.batch_max], patient=False)
                    if n_in is None:
                        done = False
                        break
                    total += n_in
                if done:
                    path.unlink(missing_ok=True)
            finally:
                fh.close()
        return total

    # ---- the API -------------------------------------------------------------------

    def admit(self) -> None:
        """Refuse a new call (503) while the backlog waiting for the database is over its
        cap: what was accepted stays safe, and memory and spool stop growing."""
        if self.backlog_bytes > self.backlog_max_bytes:
            raise APIError(
                503,
                f"recording is behind: {self.backlog_bytes >> 20} MiB of records wait for "
                f"the database (limit {self.backlog_max_bytes >> 20} MiB); retry shortly",
                headers={"Retry-After": "5"},
            )

    async def record(self, records: list[SpoolRecord]) -> Ticket:
        """Durably accept records; returns once they are in the spool (fsynced if the
        spool syncs: then through the append thread, which shares one fsync per batch),
        with the ticket of their commit (``await ticket.wait(timeout)``)."""
        self._track(records, 1)
        ticket = self.tickets.issue(len(records))
        try:
            await self._accept(records, ticket)
        except BaseException:
            self._track(records, -1)
            self.tickets.drop(ticket)
            raise
        if not self._db_ok.is_set():  # the database is unreachable: do not hold answers
            ticket.settle(False)
        return ticket

    async def _accept(self, records: list[SpoolRecord], ticket: Ticket) -> None:
        if not self.spool.fsync:
            lines = [spool_line(r) for r in records]
            seg = self.spool.append(records, lines)  # a write() to the page cache
            self._enqueue(seg, records, lines, ticket)
            return
        fut: Future = Future()
        self._appends.put((records, fut, ticket))
        await asyncio.wrap_future(fut)

    def _track(self, records: list[SpoolRecord], delta: int) -> None:
        with self._refs_lock:
            for r in records:
                it = r["interaction"]
                for ref in {it.get("id"), it.get("group_id"), it.get("session_id")} - {None}:
                    n = self._refs.get(ref, 0) + delta
                    if n > 0:
                        self._refs[ref] = n
                    else:
                        self._refs.pop(ref, None)

    def is_pending(self, ref: str) -> bool:
        """Whether a record with this interaction, group or session id was accepted by this
        process and is not committed yet (an in-memory check, no database)."""
        return ref in self._refs

    @property
    def has_pending(self) -> bool:
        """Whether any accepted record is not committed yet (in memory, no database)."""
        return bool(self._refs)

    @property
    def lag_seconds(self) -> float:
        oldest = self.oldest_pending
        return 0.0 if oldest is None else time.monotonic() - oldest

    @property
    def pending(self) -> int:
        return self.pending_records

    def problems(self) -> list[str]:
        """Why recording is not healthy now (empty when it is), for /health."""
        out = []
        lag = self.lag_seconds
        if lag > self.lag_alert_s:
            out.append(
                f"recording lags {lag:.0f}s behind (database unreachable or slow); "
                f"{self.pending} records wait in the spool"
            )
        if self.backlog_bytes > self.backlog_max_bytes:
            out.append("the recording backlog is over its cap: new calls get 503")
        if self.dead_letters.count:
            out.append(
                f"{self.dead_letters.count} records were refused by the database and kept "
                f"in {self.dead_letters.path}"
            )
        return out

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything accepted so far is in the database (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue.unfinished_tasks == 0 and self._appends.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    # ---- writing -------------------------------------------------------------------

    def _enqueue(
        self,
        seg: Segment,
        records: list[SpoolRecord],
        lines: list[bytes],
        tickets: list[Ticket] | Ticket | None = None,
    ) -> None:
        """Queue spooled records for the writer, one unit per ticket (per ``record()``
        call): a unit's records are never split between two transactions."""
        now = time.monotonic()
        with self._size_lock:
            self.backlog_bytes += sum(len(x) for x in lines)
            self.pending_records += len(records)
        per_record = tickets if isinstance(tickets, list) else [tickets] * len(records)
        unit: list[Pending] = []
        for r, x, t in zip(records, lines, per_record, strict=True):
            if unit and unit[-1].ticket is not t:
                self.queue.put(unit)
                unit = []
            unit.append(Pending(seg, r, now, len(x), t))
        if unit:
            self.queue.put(unit)

    def _store(self, records: list[SpoolRecord], patient: bool = True) -> int | None:
        """Write ``records``; returns the interactions inserted. Connection trouble is
        retried with backoff (``patient``) or answered None (the caller keeps the
        records). A refusal for content splits the batch until the refused record is
        alone; it then goes to the dead letters (after two more tries for a constraint
        violation, which can be a race with another replica)."""
        delay = 0.1
        conflicts = 0
        while True:
            try:
                with self._write_lock:
                    with self.factory() as db, db.begin():
                        inserted, sessions, followups = write_batch(db, records)
                    self.recorded_total += inserted
            except Exception as e:
                if not refused_for_content(e):
                    if self._db_ok.is_set():
                        log.warning(
                            "recording paused, database unavailable (%s); records stay "
                            "in the spool and are retried",
                            str(e).splitlines()[0] if str(e) else type(e).__name__,
                        )
                    self._db_ok.clear()
                    self.tickets.release_all()  # waiting answers go out now
                    if not patient:
                        return None
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                self._db_ok.set()
                if len(records) > 1:
                    mid = len(records) // 2
                    first = self._store(records[:mid], patient)
                    rest = None if first is None else self._store(records[mid:], patient)
                    return None if first is None or rest is None else first + rest
                if isinstance(e, IntegrityError) and conflicts < 2:
                    conflicts += 1
                    time.sleep(0.05 * conflicts)
                    continue
                self._dead_letter(records[0], describe(e))
                return 0
            self._db_ok.set()
            if sessions and self.on_sessions_written:
                self.on_sessions_written(sessions)
            if followups and self.on_followups_written:
                self.on_followups_written(followups)
            return inserted

    def _dead_letter(self, record: dict[str, Any], reason: str) -> None:
        """Keep a refused record in the dead-letter file; retried until the disk takes
        it, since the spool copy is dropped afterwards."""
        delay = 0.1
        while True:
            try:
                self.dead_letters.add(record, reason)
                break
            except OSError:
                log.exception("cannot write the dead-letter file; retrying")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        if self.on_dead_letter:
            self.on_dead_letter()

    # ---- threads -------------------------------------------------------------------

    def _append_loop(self) -> None:
        while True:
            item = self._appends.get()
            batch = [item]
            while True:
                try:
                    batch.append(self._appends.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is None for b in batch)
            work = [b for b in batch if b is not None]
            if work:
                records = [r for recs, _, _ in work for r in recs]
                tickets = [t for recs, _, t in work for _ in recs]
                try:
                    lines = [spool_line(r) for r in records]
                    seg = self.spool.append(records, lines)
                except Exception as e:  # disk full, permissions: fail the requests loudly
                    for _, fut, _ in work:
                        fut.set_exception(e)
                else:
                    self._enqueue(seg, records, lines, tickets)
                    for _, fut, _ in work:
                        fut.set_result(None)
            for _ in batch:
                self._appends.task_done()
            if stop:
                return

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            first = self.queue.get()
            batch: list[list[Pending] | None] = [first]
            count = len(first or ())
            while count < self.batch_max:  # whole units only: a unit may overshoot
                try:
                    unit = self.queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(unit)
                count += len(unit or ())
            stop = any(b is None for b in batch)
            work = [p for b in batch if b is not None for p in b]
            if work:
                self.oldest_pending = min(p.enqueued_at for p in work)
                self._store([p.record for p in work])  # patient: returns once written
                self.oldest_pending = None
                self._track([p.record for p in work], -1)
                self.tickets.written(p.ticket for p in work)  # their answers go out now
                for p in work:
                    self.spool.mark_done(p.segment, 1)
                with self._size_lock:
                    self.backlog_bytes -= sum(p.size for p in work)
                    self.pending_records -= len(work)
                if self.queue.empty():
                    self.spool.rotate_if_idle()
            for _ in batch:
                self.queue.task_done()

    def _replay_loop(self) -> None:
        """Replay orphan segments every ``replay_interval_s`` (a gateway that died while
        this one runs, or a segment start-up could not write)."""
        while not self._stop.wait(self.replay_interval_s):
            try:
                n = self.replay_orphans()
            except Exception:
                log.exception(
                    "replaying spool segments failed; retried in %ss", self.replay_interval_s
                )
                continue
            if n:
                log.info("replayed %d spooled interactions into the database", n)
