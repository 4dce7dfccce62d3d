"""The user's next message as a rating, as it arrives.

When the gateway has committed a turn that follows an earlier answer of the same session,
it enqueues the task ``rlgate.verifiers.next_turn(session_id, interaction_id)`` on the
verify queue (trainer/hooks.py ``enqueue_next_turn``), and only when the project has a
next-turn source (:func:`reads_next_turn`). The task (:func:`run_next_turn`) finds the
pair: the answer before that turn and what the user wrote after it (:func:`pair_for`),
and runs each next-turn source of the project's ``settings["verifiers"]`` on it (its
registration's ``next_turn``): the rules (``next_turn_rules``,
trainer/next_turn_rules.py) and the LLM judge in ``mode: next_turn``
(trainer/judge_run.py). Each stores its rating of the earlier answer through
core/feedback.py, then credit assignment runs (trainer.hooks.after_feedback):
``interactions.reward`` has it at once, while the session is still open. Idempotency
keys (``next_turn:rules:<id>``, ``judge:next_turn:<id>``) make a redelivered task write
nothing twice. Nothing here runs when the session closes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.feedback import FeedbackInput
from schemas.atdp import Interaction
from schemas.atdp import Session as SessionRecord
from schemas.convert import to_record
from schemas.tables import InteractionRow, ProjectRow, SessionRow
from trainer import judge_text as jt
from trainer.judge_run import turns
from trainer.verifiers import get_source, project_specs

log = logging.getLogger("rlgate.verifiers")


@dataclass(frozen=True)
class Pair:
    """An answer and what the user wrote next."""

    answer: Interaction  # the earlier answer: the target of the rating
    reply: str  # the user's next message
    question: str | None  # the user message ``answer`` replied to (for a repeat)


def next_turn_specs(project_settings: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The project's verifier specs that read the user's next message (valid ones only).
    Project settings only: session metadata can neither add nor drop one."""
    out = []
    for spec in project_specs(project_settings):
        source = get_source(spec["name"])
        if source is not None and source.reads_next_turn(spec):
            out.append(spec)
    return out


def reads_next_turn(project_settings: dict[str, Any] | None) -> bool:
    """Whether a new turn of this project is worth the next-turn task (the gateway asks)."""
    return bool(next_turn_specs(project_settings))


def _last_user(request: dict[str, Any]) -> str | None:
    texts = [text for role, text in jt.request_messages(request) if role == "user" and text]
    return texts[-1] if texts else None


def reply_to(nxt: Interaction) -> str | None:
    """What the user wrote after the previous answer (judge_text.next_user_message); when
    the request carries no earlier answer but continues one (``parent_id``: the OpenAI
    Responses API's ``previous_response_id``), its user messages, unless a tool result is
    among them."""
    reply = jt.next_user_message(nxt)
    if reply is not None or nxt.parent_id is None:
        return reply
    msgs = jt.request_messages(nxt.request)
    if any(role in ("assistant", "tool") for role, _ in msgs):
        return None
    return "\n".join(t for role, t in msgs if role == "user" and t) or None


def pair_for(interactions: list[Interaction], interaction_id: str) -> Pair | None:
    """The answer before the turn of ``interaction_id`` and the user's message after it;
    None for a session's first turn, a tool result, or an earlier turn of n > 1 choices
    that the new turn does not name as its parent."""
    steps = turns(interactions)
    by_id = {i.id: i for i in interactions}
    for k, step in enumerate(steps):
        if not any(i.id == interaction_id for i in step):
            continue
        nxt = step[0]
        before = steps[k - 1] if k > 0 else []
        prev = by_id.get(nxt.parent_id or "") or (before[0] if len(before) == 1 else None)
        reply = reply_to(nxt) if prev is not None else None
        if prev is None or not reply or prev.seq >= nxt.seq:
            return None
        return Pair(prev, reply, _last_user(prev.request))
    return None


# ---- the task's body ------------------------------------------------------------------------


def _load(
    factory: sessionmaker[Session], session_id: str
) -> tuple[SessionRecord, dict[str, Any], list[Interaction]] | None:
    with factory() as db:
        srow = db.get(SessionRow, session_id)
        if srow is None:
            return None
        project = db.get(ProjectRow, srow.project_id)
        settings = dict(project.settings or {}) if project is not None else {}
        rows = db.scalars(
            select(InteractionRow)
            .where(InteractionRow.session_id == session_id)
            .order_by(InteractionRow.seq)
        ).all()
        session = to_record(srow)
        interactions = [to_record(r) for r in rows]
    assert isinstance(session, SessionRecord)
    return session, settings, interactions  # type: ignore[return-value]


def run_next_turn(
    factory: sessionmaker[Session],
    session_id: str,
    interaction_id: str,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Rate the answer before ``interaction_id``'s turn by the user's message in it, with
    each next-turn source of the project; returns the feedback stored (JSON). A source's
    failure is logged, never raised. No judge call starts past ``deadline``."""
    from trainer.hooks import store_and_credit

    loaded = _load(factory, session_id)
    if loaded is None:
        return []
    session, settings, interactions = loaded
    specs = next_turn_specs(settings)
    pair = pair_for(interactions, interaction_id) if specs else None
    if pair is None:
        return []
    stored: list[dict[str, Any]] = []
    for spec in specs:
        source = get_source(spec["name"])
        assert source is not None and source.next_turn is not None

        def store(inp: FeedbackInput, name: str = spec["name"]) -> dict[str, Any] | None:
            return store_and_credit(factory, inp, session.project_id, name)

        try:
            stored += source.next_turn.rate(factory, session, pair, spec, store, deadline)
        except Exception:
            log.exception("%s failed on %s", spec["name"], interaction_id)
    return stored
