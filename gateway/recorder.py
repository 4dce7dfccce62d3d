"""Durable, batched recording of interactions.

The promise: once a response (or the final SSE event) is sent, its record is either
committed in the database or sits in a local append-only spool that is replayed into
the database at start-up and whenever the database is back.

- ``record()`` appends the records to the current spool segment. With ``fsync`` (setting
  ``spool_fsync``) it returns after an fdatasync, and concurrent callers share one
  (group commit), so this costs one disk flush per batch, not per request: the record
  survives power loss. Without it (the default) the append is a ``write()`` into the
  kernel's page cache, done inline: the record survives the gateway crashing or being
  killed, not the machine losing power.
- A writer thread takes records in batches, inserts them in one transaction (skipping
  ids that are already there, so replay is idempotent) and then marks them done; a
  segment whose records are all in the database is deleted.
- If the database is down the writer keeps the batch and retries with backoff; nothing
  is dropped. At start-up, segments left by a dead process (not locked) are replayed.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from schemas.atdp import Interaction
from schemas.atdp import Session as SessionRecord
from schemas.convert import to_row
from schemas.tables import InteractionRow, SessionRow

log = logging.getLogger("rlgate.recorder")

SEGMENT_MAX_RECORDS = 2000


@dataclass
class _Segment:
    path: Path
    fh: Any
    written: int = 0
    done: int = 0


@dataclass
class _Pending:
    segment: _Segment
    record: dict[str, Any]
    enqueued_at: float = field(default_factory=time.monotonic)


class Spool:
    """Append-only JSON-lines segments, fdatasync'ed per append when ``fsync``."""

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        self.fsync = fsync
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.current = self._open_segment()

    def _open_segment(self) -> _Segment:
        path = self.dir / f"segment-{time.time_ns()}-{os.getpid()}.jsonl"
        fh = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the segment
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return _Segment(path, fh)

    def append(self, records: list[dict[str, Any]]) -> _Segment:
        data = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        with self.lock:
            seg = self.current
            seg.fh.write(data)
            if self.fsync:
                os.fdatasync(seg.fh.fileno())
            seg.written += len(records)
            if seg.written >= SEGMENT_MAX_RECORDS:
                self.current = self._open_segment()
            return seg

    def mark_done(self, seg: _Segment, n: int) -> None:
        with self.lock:
            seg.done += n
            if seg is not self.current and seg.done >= seg.written:
                seg.fh.close()
                seg.path.unlink(missing_ok=True)

    def rotate_if_idle(self, min_records: int = 200) -> None:
        """Start a new segment once the current one holds enough records, all of them in
        the database (rotating after every record would cost a file per request)."""
        with self.lock:
            seg = self.current
            if seg.written >= min_records and seg.done >= seg.written:
                self.current = self._open_segment()
                seg.fh.close()
                seg.path.unlink(missing_ok=True)

    def orphans(self) -> list[Path]:
        """Segments of processes that are gone (their lock is free)."""
        out = []
        for path in sorted(self.dir.glob("segment-*.jsonl")):
            if path == self.current.path:
                continue
            try:
                with open(path, "rb") as fh:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
                out.append(path)
            except BlockingIOError:
                continue  # a live gateway owns it
        return out

    def close(self) -> None:
        with self.lock:
            self.current.fh.close()
            if self.current.done >= self.current.written:
                self.current.path.unlink(missing_ok=True)


def write_batch(db: Session, entries: list[dict[str, Any]]) -> tuple[int, set[str]]:
    """Insert what is not in the database yet: the sessions new calls opened, then the
    interactions. Returns (interactions inserted, ids of the sessions carried along)."""
    carried = {e["session"]["id"]: e["session"] for e in entries if e.get("session")}
    if carried:
        have = set(db.scalars(select(SessionRow.id).where(SessionRow.id.in_(list(carried)))))
        for sid, row in carried.items():
            if sid not in have:
                db.add(to_row(SessionRecord.model_validate(row)))
        db.flush()
    records = [e["interaction"] for e in entries]
    ids = [r["id"] for r in records]
    existing = set(db.scalars(select(InteractionRow.id).where(InteractionRow.id.in_(ids))))
    fresh = [r for r in records if r["id"] not in existing]
    if not fresh:
        return 0, set(carried)
    sessions = {r["session_id"] for r in fresh}
    next_seq = dict(
        db.execute(
            select(InteractionRow.session_id, func.max(InteractionRow.seq))
            .where(InteractionRow.session_id.in_(sessions))
            .group_by(InteractionRow.session_id)
        ).all()
    )
    last_activity: dict[str, Any] = {}
    rows = []
    for r in sorted(fresh, key=lambda r: (r["created_at"], r.get("choice_index", 0))):
        record = Interaction.model_validate({**r, "seq": 0})
        seq = next_seq.get(r["session_id"])
        seq = 0 if seq is None else seq + 1
        next_seq[r["session_id"]] = seq
        rows.append({**record.model_dump(mode="python", exclude={"atdp_version"}), "seq": seq})
        prev = last_activity.get(record.session_id)
        last_activity[record.session_id] = (
            max(prev, record.created_at) if prev else record.created_at
        )
    # Core statements, one executemany each: no ORM unit of work or session synchronization
    db.execute(insert(InteractionRow.__table__), rows)
    sessions_table = SessionRow.__table__
    db.execute(
        update(sessions_table)
        .where(
            sessions_table.c.id == bindparam("sid"),
            sessions_table.c.last_activity_at < bindparam("at"),
        )
        .values(last_activity_at=bindparam("at")),
        [{"sid": sid, "at": at} for sid, at in last_activity.items()],
    )
    return len(fresh), set(carried)


class Recorder:
    def __init__(
        self,
        factory: sessionmaker[Session],
        spool_dir: Path,
        batch_max: int = 256,
        fsync: bool = True,
        on_sessions_written: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.on_sessions_written = on_sessions_written
        self.factory = factory
        self.spool = Spool(spool_dir, fsync)
        self.batch_max = batch_max
        self.queue: queue.Queue[_Pending | None] = queue.Queue()
        self._appends: queue.Queue[tuple[list[dict[str, Any]], Future] | None] = queue.Queue()
        self.recorded_total = 0
        self.oldest_pending: float | None = None
        self._threads: list[threading.Thread] = []
        self._db_ok = threading.Event()
        self._db_ok.set()

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        replayed = self.replay_orphans()
        if replayed:
            log.info("replayed %d spooled interactions into the database", replayed)
        for target in (self._append_loop, self._write_loop):
            t = threading.Thread(target=target, daemon=True, name=f"rlgate-{target.__name__}")
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        self._appends.put(None)
        self.queue.put(None)
        for t in self._threads:
            t.join(timeout)
        self.spool.close()

    def replay_orphans(self) -> int:
        total = 0
        for path in self.spool.orphans():
            records = []
            with open(path, "rb") as fh:
                for line in fh:
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        # a torn last line: its response was never acknowledged
                        continue
            for i in range(0, len(records), self.batch_max):
                with self.factory() as db, db.begin():
                    total += write_batch(db, records[i : i + self.batch_max])[0]
            path.unlink()
        return total

    # ---- the API -------------------------------------------------------------------

    async def record(self, records: list[dict[str, Any]]) -> None:
        """Durably accept records; returns once they are in the spool (fsynced if the
        spool syncs: then through the append thread, which shares one fsync per batch)."""
        if not self.spool.fsync:
            seg = self.spool.append(records)  # a write() to the page cache: microseconds
            now = time.monotonic()
            for r in records:
                self.queue.put(_Pending(seg, r, now))
            return
        fut: Future = Future()
        self._appends.put((records, fut))
        await asyncio.wrap_future(fut)

    @property
    def lag_seconds(self) -> float:
        oldest = self.oldest_pending
        return 0.0 if oldest is None else time.monotonic() - oldest

    @property
    def pending(self) -> int:
        return self.queue.qsize()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything accepted so far is in the database (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue.unfinished_tasks == 0 and self._appends.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

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
                records = [r for recs, _ in work for r in recs]
                try:
                    seg = self.spool.append(records)
                except Exception as e:  # disk full, permissions: fail the requests loudly
                    for _, fut in work:
                        fut.set_exception(e)
                else:
                    now = time.monotonic()
                    for r in records:
                        self.queue.put(_Pending(seg, r, now))
                    for _, fut in work:
                        fut.set_result(None)
            for _ in batch:
                self._appends.task_done()
            if stop:
                return

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            first = self.queue.get()
            batch: list[_Pending | None] = [first]
            while len(batch) < self.batch_max:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is None for b in batch)
            work = [b for b in batch if b is not None]
            if work:
                self.oldest_pending = min(p.enqueued_at for p in work)
                self._write_with_retry(work)
                self.oldest_pending = None
                for p in work:
                    self.spool.mark_done(p.segment, 1)
                if self.queue.empty():
                    self.spool.rotate_if_idle()
            for _ in batch:
                self.queue.task_done()

    def _write_with_retry(self, work: list[_Pending]) -> None:
        delay = 0.1
        while True:
            try:
                with self.factory() as db, db.begin():
                    inserted, sessions = write_batch(db, [p.record for p in work])
                self.recorded_total += inserted
                if sessions and self.on_sessions_written:
                    self.on_sessions_written(sessions)
                self._db_ok.set()
                return
            except Exception as e:
                if self._db_ok.is_set():
                    log.warning(
                        "recording paused, database unavailable (%s); records stay "
                        "in the spool and are retried",
                        str(e).splitlines()[0],
                    )
                self._db_ok.clear()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
