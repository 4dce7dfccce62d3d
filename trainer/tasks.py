"""Celery tasks of the trainer and the beat schedule.

- ``rlgate.train_project(project_id, trigger, run_id)``: one run (idempotent: a finished
  ``run_id`` is not redone; a second run of a busy project is skipped).
- ``rlgate.tick()``: the beat job (every ``RLGATE_TRAIN_TICK_S`` seconds, default 60):
  re-publish runs left ``trained-not-published``, reload serving adapters an engine lost,
  run the guards (trainer/guards.py: roll back a serving version that got worse), and
  start runs that are due (threshold reached, or the schedule with >= min_samples).
- ``rlgate.retry_publish()``: only the re-publish part.
- ``rlgate.verifiers.verify_session(session_id)``: run the configured verifiers on a
  closed session (trainer/hooks.py enqueues it on the queue ``rlgate.verify`` and holds
  its body). It runs in the verify pool (``rlgate worker`` starts it beside the trainer),
  under a hard time limit (RLGATE_VERIFY_TIME_LIMIT_S) and at most
  RLGATE_VERIFY_PER_PROJECT at once per project (trainer/verify_leases.py): one project's
  slow judge neither delays training nor another project's ratings. A verify task that
  arrives on another queue (one queued before the verify queue existed) is moved there.
- ``rlgate.verifiers.next_turn(session_id, interaction_id)``: rate the answer before that
  turn by the user's message in it (trainer/next_turn.py), as the message arrives; the
  gateway enqueues it on the verify queue, and it runs in the verify pool like the above.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from trainer import hooks, runner, serving_switch, triggers, verify_leases
from trainer.celery_base import app

log = logging.getLogger("rlgate.trainer")

TRAIN_TASK = "rlgate.train_project"
TICK_S = float(os.environ.get("RLGATE_TRAIN_TICK_S", "60"))
LEASE_WAIT_S = 2.0  # a task whose project's verify slots are all taken is retried after this
STORE_MARGIN_S = 5.0  # of the time limit, kept for storing the ratings

app.conf.beat_schedule = {
    **(app.conf.beat_schedule or {}),
    "rlgate-trainer-tick": {"task": "rlgate.tick", "schedule": TICK_S},
}


@app.task(name=TRAIN_TASK, acks_late=True)
def train_project(
    project_id: str, trigger: str = "manual", run_id: str | None = None
) -> dict[str, Any]:
    try:
        result = runner.run_training(project_id, trigger, run_id)
    finally:
        _give_memory_back()
    return {k: v for k, v in result.items() if k != "steps"}


def _give_memory_back() -> None:
    """glibc keeps a run's freed activations in its arenas (a long-lived CPU worker stayed
    at 9 GB after a run); hand them back to the system."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@app.task(name="rlgate.retry_publish")
def retry_publish() -> list[str]:
    return serving_switch.retry_publish()


@app.task(name="rlgate.tick")
def tick() -> dict[str, Any]:
    from core.settings import get_settings
    from trainer.publish import PublishError, engines, sync_engines

    settings = get_settings()
    factory = serving_switch.db_factory(settings)
    published = serving_switch.retry_publish(settings, factory)
    try:
        reloaded = sync_engines(factory, engines(settings))
    except PublishError as e:  # the router cannot list its workers: the next tick retries
        log.warning("%s", e)
        reloaded = []
    rolled_back = runner.guard_all(factory, settings)
    started = []
    for project_id, trigger in triggers.due_projects(factory):
        train_project.delay(project_id, trigger)
        started.append(f"{project_id}:{trigger}")
    if published or reloaded or started or rolled_back:
        log.info(
            "tick: published=%s reloaded=%s rolled_back=%s started=%s",
            published,
            reloaded,
            rolled_back,
            started,
        )
    return {
        "published": published,
        "reloaded": reloaded,
        "rolled_back": rolled_back,
        "started": started,
    }


@app.task(name=hooks.VERIFY_TASK, acks_late=True, bind=True, max_retries=None)
def verify_session(self: Any, session_id: str) -> int:
    """Celery task: run the configured verifiers on a closed session, in one of its
    project's verify slots (retried later when they are all taken)."""
    queue = (self.request.delivery_info or {}).get("routing_key")
    if queue and queue != hooks.VERIFY_QUEUE:
        # queued before verification had its own queue (an upgrade), or by hand: a judge
        # must never hold a trainer's process, so it goes to the verify pool
        log.info(
            "verify task for %s came on %r; moved to %s", session_id, queue, hooks.VERIFY_QUEUE
        )
        hooks.enqueue_verification(session_id)
        return 0
    return _in_verify_slot(self, session_id, lambda f, d: hooks.run_verifiers(f, session_id, d))


@app.task(name=hooks.NEXT_TURN_TASK, acks_late=True, bind=True, max_retries=None)
def next_turn(self: Any, session_id: str, interaction_id: str) -> int:
    """Celery task: rate the answer before ``interaction_id``'s turn by the user's next
    message (trainer/next_turn.py), in one of its project's verify slots."""
    from trainer.next_turn import run_next_turn

    queue = (self.request.delivery_info or {}).get("routing_key")
    if queue and queue != hooks.VERIFY_QUEUE:
        hooks.enqueue_next_turn(session_id, interaction_id)  # never in a trainer's process
        return 0
    return _in_verify_slot(
        self, session_id, lambda f, d: run_next_turn(f, session_id, interaction_id, d)
    )


def _in_verify_slot(task: Any, session_id: str, body: Callable[[Any, float], list[Any]]) -> int:
    """Run ``body(factory, deadline)`` in one of the session's project's verify slots,
    under the verify time limit; retried later when the slots are all taken."""
    from core.settings import get_settings

    settings = get_settings()
    factory = hooks.factory_for(settings.effective_database_url)
    project_id = hooks.project_of(factory, session_id)
    if project_id is None:
        return 0
    limit = settings.verify_time_limit_s
    holder = str(task.request.id or session_id)
    slot = verify_leases.acquire(
        factory, project_id, settings.verify_per_project, limit + 30.0, holder
    )
    if slot is None:
        raise task.retry(countdown=LEASE_WAIT_S)
    try:
        deadline = time.monotonic() + max(1.0, limit - STORE_MARGIN_S)
        return len(body(factory, deadline))
    finally:
        verify_leases.release(factory, project_id, slot, holder)
