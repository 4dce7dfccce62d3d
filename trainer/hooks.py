"""The trainer's side of a rating and of a closed session.

- :func:`after_feedback`: after a new feedback record (a client's, or a verifier's):
  credit assignment for its session (``interactions.reward`` stays current) and, on a
  session rating when the project has ``settings["close_session_on_rating"]``, closing
  the session.
- :func:`on_session_closed`: after a session was closed or expired: credit assignment
  again (the ``wait`` policy settles now) and, when a verifier is configured, the verifier
  task ``rlgate.verifiers.verify_session`` (:func:`enqueue_verification`).
- :func:`run_verifiers`: that task's body (trainer/tasks.py). It scores the final turn
  (trainer/verifiers.py): one answer -> one session-level feedback; an n>1 final turn ->
  one interaction feedback per member. Feedback has ``source="verifier"``,
  ``rater=<verifier name>`` and an idempotency key, so a redelivered task does not rate
  twice. A spec whose registration rates whole sessions (``rate_session``: the LLM judge,
  trainer/judge_run.py) runs that instead, with its ``feedback_source`` (``judge``).
  Nothing here names a verifier: each spec runs as its registration says
  (trainer/reward_registry.py). Specs that read the user's next message (the
  ``next_turn_rules``, the judge in ``mode: next_turn``) do not run at the close.
- :func:`enqueue_next_turn`: the task ``rlgate.verifiers.next_turn`` for a turn that
  follows an answer (the gateway enqueues it after the turn's commit); its body is
  trainer/next_turn.py ``run_next_turn``.

The gateway reaches these through trainer/api.py only. Feedback rows are written by
core/feedback.py for every source.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.feedback import (
    FeedbackInput,
    Scope,
    close_session,
    feedback_json,
    project_settings,
    store_feedback,
)
from schemas.atdp import Interaction
from schemas.atdp import Session as SessionRecord
from schemas.convert import to_record
from schemas.tables import FeedbackRow, InteractionRow, ProjectRow, SessionRow
from trainer.credit import assign_rewards_tx
from trainer.reward_source import RewardSource
from trainer.verifiers import VerifierContext, configured_verifiers, get_source

log = logging.getLogger("rlgate.verifiers")
feedback_log = logging.getLogger("rlgate.feedback")

VERIFY_TASK = "rlgate.verifiers.verify_session"
NEXT_TURN_TASK = "rlgate.verifiers.next_turn"
VERIFY_QUEUE = "rlgate.verify"  # the verify pool's queue: never the trainer's


# ---- after a rating -------------------------------------------------------------------------


def after_feedback(factory: sessionmaker[Session], row: FeedbackRow) -> None:
    """Bring ``interactions.reward`` of the rated session up to date; close it on a session
    rating when the project has ``settings["close_session_on_rating"]``."""
    if row.session_id is None:
        return
    closed = False
    if row.target_type == "session":
        with factory() as db, db.begin():
            if project_settings(db, row.project_id).get("close_session_on_rating"):
                closed = close_session(db, row.session_id)
    try:
        assign_rewards_tx(factory, row.project_id, row.session_id)
    except Exception:  # the rating is stored; the trainer's sweep assigns it later
        feedback_log.exception("credit assignment for session %s failed", row.session_id)
    if closed:
        on_session_closed(factory, row.session_id)  # never raises


# ---- after a session closed -----------------------------------------------------------------


def enqueue_verification(session_id: str) -> None:
    from trainer.celery_base import publisher

    publisher().send_task(
        VERIFY_TASK,
        args=[session_id],
        queue=VERIFY_QUEUE,
        retry=True,
        retry_policy={"max_retries": 3, "interval_start": 0, "interval_step": 0.5},
    )


def enqueue_next_turn(session_id: str, interaction_id: str) -> None:
    """Queue the next-turn task for a committed turn (on the verify queue)."""
    from trainer.celery_base import publisher

    publisher().send_task(
        NEXT_TURN_TASK,
        args=[session_id, interaction_id],
        queue=VERIFY_QUEUE,
        retry=True,
        retry_policy={"max_retries": 3, "interval_start": 0, "interval_step": 0.5},
    )


def _at_close(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The specs that run when a session closes: not those reading the next message."""
    out = []
    for spec in specs:
        source = get_source(spec["name"])
        if source is None or not source.reads_next_turn(spec):
            out.append(spec)
    return out


def on_session_closed(factory: sessionmaker[Session], session_id: str) -> bool:
    """Call after a session was closed or expired (after the commit). Re-runs credit
    assignment (the ``wait`` policy settles now) and enqueues the verifier task when a
    verifier is configured; returns whether it enqueued. Never raises."""
    try:
        with factory() as db:
            srow = db.get(SessionRow, session_id)
            if srow is None:
                return False
            project_id, meta = srow.project_id, dict(srow.meta or {})
            project = db.get(ProjectRow, project_id)
            settings = dict(project.settings or {}) if project is not None else {}
        assign_rewards_tx(factory, project_id, session_id)
        if not _at_close(configured_verifiers(settings, meta)):
            return False
        enqueue_verification(session_id)
        return True
    except Exception:
        log.exception("session-closed hook failed for %s", session_id)
        return False


# ---- the verifier task ----------------------------------------------------------------------


def _final_turn(interactions: list[Interaction]) -> list[Interaction]:
    live = [i for i in interactions if i.finish_reason != "abort"]
    if not live:
        return []
    last = max(live, key=lambda i: i.seq)
    if last.group_id is None:
        return [last]
    return sorted((i for i in live if i.group_id == last.group_id), key=lambda i: i.choice_index)


def run_verifiers(
    factory: sessionmaker[Session], session_id: str, deadline: float | None = None
) -> list[dict[str, Any]]:
    """Run the session's verifiers and store their feedback; returns the feedback JSON.
    No judge call starts past ``deadline`` (time.monotonic())."""
    with factory() as db:
        srow = db.get(SessionRow, session_id)
        if srow is None:
            return []
        session = to_record(srow)
        project = db.get(ProjectRow, srow.project_id)
        settings = dict(project.settings or {}) if project is not None else {}
        interactions = [
            to_record(r)
            for r in db.scalars(
                select(InteractionRow)
                .where(InteractionRow.session_id == session_id)
                .order_by(InteractionRow.seq)
            ).all()
        ]
    assert isinstance(session, SessionRecord)
    final = _final_turn(interactions)  # type: ignore[arg-type]
    if not final:
        return []
    stored = []
    for spec in _at_close(configured_verifiers(settings, session.metadata or {})):
        name = spec["name"]
        source = get_source(name)
        if source is None or (source.score is None and source.rate_session is None):
            log.warning("unknown verifier %r for session %s", name, session_id)
            continue
        if source.rate_session is not None:  # e.g. the LLM judge: whole sessions and groups
            stored += _rate_session(factory, session, interactions, spec, source, deadline)  # type: ignore[arg-type]
            continue
        fn = source.score
        assert fn is not None  # a source has a runner (checked above)
        ctx = VerifierContext(session, interactions, spec)  # type: ignore[arg-type]
        for answer in final:
            try:
                score = fn(ctx, answer)
            except Exception:
                log.exception("verifier %s failed on %s", name, answer.id)
                continue
            if score is None:
                continue
            score = max(-1.0, min(1.0, float(score)))
            whole = len(final) == 1
            target = "session" if whole else "interaction"
            ref = session_id if whole else answer.id
            inp = FeedbackInput(
                target=target,
                ref=ref,
                value=score,
                scale="scalar",
                scale_min=-1.0,
                scale_max=1.0,
                reward=score,
                source=source.feedback_source,
                rater=name,
                idempotency_key=f"verifier:{name}:{ref}",
            )
            try:
                row, replayed = store_feedback(
                    factory, inp, Scope(session.project_id, session_id), wait_s=0
                )
                if not replayed:
                    after_feedback(factory, row)
                fb = feedback_json(row)
            except Exception as e:  # e.g. 409: a redelivered task scored differently
                log.warning("verifier %s feedback on %s not stored: %s", name, ref, e)
                continue
            stored.append(fb)
    return stored


def _rate_session(
    factory: sessionmaker[Session],
    session: SessionRecord,
    interactions: list[Interaction],
    spec: dict[str, Any],
    source: RewardSource,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """A source that rates whole sessions (the LLM judge, trainer/judge_run.py); its
    feedback goes through the same store and after-feedback path as a verifier's. A
    failure is logged, never raised."""
    assert source.rate_session is not None

    def store(inp: FeedbackInput) -> dict[str, Any] | None:
        return store_and_credit(factory, inp, session.project_id, source.name)

    try:
        return source.rate_session(factory, session, interactions, spec, store, deadline)
    except Exception:
        log.exception("%s failed on session %s", source.name, session.id)
        return []


def store_and_credit(
    factory: sessionmaker[Session], inp: FeedbackInput, project_id: str, name: str
) -> dict[str, Any] | None:
    """Store a source's rating (targets of ``project_id`` only) and, when it is new,
    credit assignment for its session; the stored feedback (JSON), or None when it was
    refused (e.g. 409: a redelivered task rated differently). Never raises."""
    try:
        row, replayed = store_feedback(factory, inp, Scope(project_id), wait_s=0)
        if not replayed:
            after_feedback(factory, row)
        return feedback_json(row)
    except Exception as e:
        log.warning("%s feedback on %s not stored: %s", name, inp.ref, e)
        return None


def project_of(factory: sessionmaker[Session], session_id: str) -> str | None:
    with factory() as db:
        return db.scalar(select(SessionRow.project_id).where(SessionRow.id == session_id))


@lru_cache(maxsize=4)
def factory_for(url: str) -> sessionmaker[Session]:
    """One session factory per database URL (the verifier task's, from the settings)."""
    from core.db import make_engine, session_factory

    return session_factory(make_engine(url))
