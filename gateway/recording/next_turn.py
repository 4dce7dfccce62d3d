"""The gateway's part of the next-turn signal: after the recorder committed a turn that
follows an earlier one of its session (gateway/recording/record_batch.py ``Followup``), queue the
trainer's next-turn task for it (trainer/next_turn.py rates the earlier answer by the
user's message in it, in the worker's verify pool) when the turn's project has a
next-turn source in ``settings["verifiers"]`` (``next_turn_rules``, or the judge in
``mode: next_turn``).

Off the request path and off the recorder's writer: the writer hands the turns over
(:meth:`NextTurnDispatch.committed`, a put on a bounded queue that never blocks) and a
thread of its own reads each project's setting (cached ``ttl_s``, like the other
per-project settings of the gateway) and publishes the tasks. The gateway never writes
the feedback. What the queue cannot take (more than :data:`MAX_WAITING` turns waiting,
the broker unreachable after its retries) is logged and counted, never retried: that
turn's next-turn rating is lost, nothing else.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN
from gateway.recording.record_batch import Followup
from schemas.tables import ProjectRow

log = logging.getLogger("rlgate.next_turn")

MAX_WAITING = 10_000  # turns handed over and not yet dispatched


class NextTurnDispatch:
    def __init__(
        self,
        factory: sessionmaker[Session],
        ttl_s: float = 5.0,
        enqueue: Callable[[str, str], None] | None = None,
        reads_next_turn: Callable[[dict[str, Any] | None], bool] | None = None,
    ) -> None:
        from trainer import api as trainer_api

        self.factory = factory
        self.ttl_s = ttl_s
        self.enqueue = enqueue or trainer_api.enqueue_next_turn
        self.reads_next_turn = reads_next_turn or trainer_api.reads_next_turn
        self._cache: dict[str, tuple[float, bool]] = {}
        self._queue: queue.Queue[list[Followup] | None] = queue.Queue(MAX_WAITING)
        self._thread: threading.Thread | None = None
        self.enqueued = 0
        self.dropped = 0

    # ---- the recorder's side ------------------------------------------------------------

    def committed(self, turns: list[Followup]) -> None:
        """The recorder committed these turns (its writer thread): never blocks."""
        try:
            self._queue.put_nowait(list(turns))
        except queue.Full:
            self.dropped += len(turns)
            log.warning("next-turn dispatch is behind: %d turns not rated", len(turns))

    # ---- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rlgate-next-turn")
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Dispatch what was handed over, then stop (after the recorder stopped)."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def _loop(self) -> None:
        while True:
            turns = self._queue.get()
            if turns is None:
                return
            try:
                self.dispatch(turns)
            except Exception:  # never let one batch stop the thread
                log.exception("next-turn dispatch failed for %d turns", len(turns))

    def dispatch(self, turns: list[Followup]) -> int:
        """Queue the next-turn task for each turn whose project reads the next message;
        returns how many were queued."""
        sent = 0
        for turn in turns:
            if not self.wanted(turn.project_id):
                continue
            try:
                self.enqueue(turn.session_id, turn.interaction_id)
            except Exception as e:  # the broker is unreachable (after its own retries)
                self.dropped += 1
                log.warning("next-turn task for %s not queued: %s", turn.interaction_id, e)
                continue
            sent += 1
        self.enqueued += sent
        return sent

    def wanted(self, project_id: str) -> bool:
        """Whether the project has a next-turn source (its settings, cached ``ttl_s``)."""
        now = time.monotonic()
        hit = self._cache.get(project_id)
        if hit and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            with self.factory() as db:
                project = db.get(ProjectRow, project_id)
                settings = dict(project.settings or {}) if project is not None else None
        except DB_DOWN:
            return hit[1] if hit else False
        wanted = self.reads_next_turn(settings)
        self._cache[project_id] = (now, wanted)
        return wanted
