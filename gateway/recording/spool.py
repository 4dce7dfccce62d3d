"""The recording spool: append-only JSON-lines segments, one locked file per process.

A record's line is appended (and fdatasync'ed when ``fsync``) before its response is
sent; a segment whose records are all in the database is deleted. Segments of processes
that are gone are unlocked: ``claim`` locks one for replay (gateway.recording.recorder).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from gateway.recording.commits import Ticket

SEGMENT_MAX_RECORDS = 2000


class SpoolRecord(TypedDict):
    """One recorded choice, a line of the spool: the ATDP interaction (``Interaction``
    dumped in JSON mode) and, with the first call of a session the call opened, that
    session's row (``Session`` in JSON mode; None otherwise). gateway/recording/record_batch.py
    writes it to the database; gateway/recording/redaction.py redacts it before it is spooled."""

    interaction: dict[str, Any]
    session: dict[str, Any] | None


@dataclass
class Segment:
    path: Path
    fh: Any
    written: int = 0
    done: int = 0


@dataclass
class Pending:
    segment: Segment
    record: SpoolRecord
    enqueued_at: float = field(default_factory=time.monotonic)
    size: int = 0  # bytes of its spool line
    ticket: Ticket | None = None  # the commit its request waits for (gateway.recording.commits)


def spool_line(record: SpoolRecord) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


class Spool:
    """Append-only JSON-lines segments, fdatasync'ed per append when ``fsync``."""

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        self.fsync = fsync
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.current = self._open_segment()

    def _open_segment(self) -> Segment:
        path = self.dir / f"segment-{time.time_ns()}-{os.getpid()}.jsonl"
        fh = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the segment
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return Segment(path, fh)

    def append(self, records: list[SpoolRecord], lines: list[bytes] | None = None) -> Segment:
        data = b"".join(lines if lines is not None else [spool_line(r) for r in records])
        with self.lock:
            seg = self.current
            seg.fh.write(data)
            if self.fsync:
                os.fdatasync(seg.fh.fileno())
            seg.written += len(records)
            if seg.written >= SEGMENT_MAX_RECORDS:
                self.current = self._open_segment()
            return seg

    def mark_done(self, seg: Segment, n: int) -> None:
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
        """Segments that are not this process's current one (they may still be owned
        by a live gateway: ``claim`` tells)."""
        return [p for p in sorted(self.dir.glob("segment-*.jsonl")) if p != self.current.path]

    @staticmethod
    def claim(path: Path) -> Any | None:
        """The segment opened and locked, or None when a live process holds it (or it
        is gone). Holding the lock while replaying keeps two gateways sharing the
        directory from replaying the same segment at once."""
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by the caller
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return None
        return fh

    def close(self) -> None:
        with self.lock:
            self.current.fh.close()
            if self.current.done >= self.current.written:
                self.current.path.unlink(missing_ok=True)
