"""Running the LLM judge on a closed session (the verifier task's ``judge`` spec,
trainer/hooks.py): which targets each mode judges, and the sibling sessions of a task
for the ``group`` mode; in ``next_turn`` mode, one answer as the user's next message
arrives (:func:`judge_next_turn`, run by trainer/next_turn.py), never at the close. The
calls themselves are trainer/judge.py's. :data:`JUDGE` is the judge's one registration
as a reward source (trainer/reward_registry.py collects it)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.feedback import FeedbackInput
from core.grants import GrantError, Grants, JudgeGrant
from schemas.atdp import FeedbackSource, Interaction
from schemas.atdp import Session as SessionRecord
from schemas.convert import to_record
from schemas.tables import InteractionRow, SessionRow
from trainer import judge
from trainer import judge_text as jt
from trainer.reward_source import GrantRef, NextTurn, RewardSource

log = logging.getLogger("rlgate.judge")

MAX_GROUP = 16  # choices of an n > 1 turn judged in one call
SIBLING_LOOKBACK = 64  # closed sessions of a task looked at for a group


def run_judge(
    factory: sessionmaker[Session],
    session: SessionRecord,
    interactions: list[Interaction],
    spec: dict[str, Any],
    store: judge.Store,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Judge the closed ``session`` as ``spec`` says; returns the stored feedback (JSON).
    Never raises for a judge failure: those are retried, skipped and counted. No call
    starts past ``deadline`` (time.monotonic(); the verify task's time limit)."""
    try:
        cfg = judge.settings_for(spec, session.project_id)
    except GrantError as e:  # the operator removed the entry, or no longer grants it
        log.warning("judge not run for session %s: %s", session.id, e)
        return []
    caller = judge.Caller(factory, session.project_id, session.id, cfg, deadline)
    steps = turns(interactions)
    if not steps:
        return []
    final, mode = steps[-1], cfg["mode"]
    if mode == "next_turn":  # rated as each next message arrives (judge_next_turn)
        return []
    if mode == "session":
        return run_session_mode(caller, session, final, store)
    if len(final) > 1:  # group: the choices of the final n > 1 request
        members = [("interaction", a.id, a) for a in final[:MAX_GROUP]]
        keys = [f"judge:group:{a.id}" for _, _, a in members]
        if judge.judged(factory, session.project_id, keys):
            return []
        return judge_group(caller, members, store)
    if session.task_id is None:
        log.info(
            "judge (group) skips session %s: no task_id and no n > 1 answer to compare with; "
            "use mode 'session' for single trajectories",
            session.id,
        )
        return []
    group = sibling_group(factory, session.project_id, session.task_id, cfg["group_size"])
    if not group:
        return []
    return judge_group(caller, [("session", sid, a) for sid, a in group], store)


def sibling_group(
    factory: sessionmaker[Session], project_id: str, task_id: str, size: int
) -> list[tuple[str, Interaction]]:
    """The ``size`` oldest closed, not yet judged sessions of the task whose final turn is
    one answer, with that answer; [] while fewer are closed (a later close judges them)."""
    with factory() as db:
        sids = list(
            db.scalars(
                select(SessionRow.id)
                .where(
                    SessionRow.project_id == project_id,
                    SessionRow.task_id == task_id,
                    SessionRow.status != "open",
                )
                .order_by(SessionRow.last_activity_at.desc(), SessionRow.id.desc())
                .limit(SIBLING_LOOKBACK)
            ).all()
        )
    done = judge.judged(factory, project_id, [f"judge:group:{s}" for s in sids])
    sids = [s for s in reversed(sids) if f"judge:group:{s}" not in done]  # oldest first
    if len(sids) < size:
        log.info(
            "judge (group): task %s has %d of %d sessions to compare", task_id, len(sids), size
        )
        return []
    with factory() as db:
        rows = db.scalars(
            select(InteractionRow)
            .where(InteractionRow.session_id.in_(sids))
            .order_by(InteractionRow.seq)
        ).all()
        by_session: dict[str, list[Interaction]] = {}
        for row in rows:
            rec = to_record(row)
            assert isinstance(rec, Interaction)
            by_session.setdefault(row.session_id, []).append(rec)
    group = []
    for sid in sids:
        steps = turns(by_session.get(sid, []))
        if steps and len(steps[-1]) == 1:
            group.append((sid, steps[-1][0]))
        if len(group) == size:
            return group
    return []


# ---- the modes ---------------------------------------------------------------------------


def _scored(mode: str, target: str, ref: str, verdict: jt.Verdict, model: str) -> FeedbackInput:
    return FeedbackInput(
        target=target,
        ref=ref,
        value=verdict.score,
        scale="scalar",
        scale_min=0.0,
        scale_max=1.0,
        reward=2.0 * verdict.score - 1.0,
        source="judge",
        rater=f"judge:{mode}",
        idempotency_key=f"judge:{mode}:{ref}",
        rationale=verdict.rationale or None,
        judge_model=model,
    )


def turns(interactions: list[Interaction]) -> list[list[Interaction]]:
    """The session's requests in order: one list per request (the choices of n > 1)."""
    live = sorted((i for i in interactions if i.finish_reason != "abort"), key=lambda i: i.seq)
    out: list[list[Interaction]] = []
    index: dict[str, list[Interaction]] = {}
    for i in live:
        if i.group_id is not None and i.group_id in index:
            index[i.group_id].append(i)
            continue
        out.append([i])
        if i.group_id is not None:
            index[i.group_id] = out[-1]
    return [sorted(t, key=lambda i: i.choice_index) for t in out]


def run_session_mode(
    caller: judge.Caller, session: SessionRecord, final: list[Interaction], store: judge.Store
) -> list[dict[str, Any]]:
    cfg, whole = caller.cfg, len(final) == 1
    refs = [session.id] if whole else [a.id for a in final]
    done = judge.judged(caller.factory, session.project_id, [f"judge:session:{r}" for r in refs])
    out = []
    for answer, ref in zip(final, refs, strict=True):
        if f"judge:session:{ref}" in done:
            continue
        verdict = caller.ask(
            jt.session_prompt(cfg["rubric"], jt.transcript(answer)), jt.parse_session
        )
        if verdict is not None:
            fb = store(
                _scored(
                    "session", "session" if whole else "interaction", ref, verdict, cfg["model"]
                )
            )
            out += [fb] if fb else []
    return out


def judge_next_turn(
    factory: sessionmaker[Session],
    session: SessionRecord,
    pair: Any,
    spec: dict[str, Any],
    store: judge.Store,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """The judge in ``next_turn`` mode on one answer and the user's next message
    (``pair``: trainer/next_turn.py ``Pair``), as that message arrives: the label's reward
    (judge_text.NEXT_TURN_REWARDS) on the answer; ``new_topic`` gives no rating. An answer
    already judged is not sent again."""
    try:
        cfg = judge.settings_for(spec, session.project_id)
    except GrantError as e:
        log.warning("judge not run for session %s: %s", session.id, e)
        return []
    prev, reply = pair.answer, pair.reply
    key = f"judge:next_turn:{prev.id}"
    if judge.judged(factory, session.project_id, [key]):
        return []
    caller = judge.Caller(factory, session.project_id, session.id, cfg, deadline)
    previous = jt.transcript(prev, limit=6000)
    verdict = caller.ask(jt.next_turn_prompt(previous, reply), jt.parse_next_turn)
    if verdict is None or jt.NEXT_TURN_REWARDS.get(verdict.label or "") is None:
        return []  # skipped (counted) or new_topic: no rating
    inp = FeedbackInput(
        target="interaction",
        ref=prev.id,
        value=verdict.score,
        scale="scalar",
        scale_min=-1.0,
        scale_max=1.0,
        reward=verdict.score,
        source="judge",
        rater="judge:next_turn",
        comment=f"next turn: {verdict.label}",
        idempotency_key=key,
        rationale=verdict.rationale or None,
        judge_model=cfg["model"],
    )
    fb = store(inp)
    return [fb] if fb else []


def judge_group(
    caller: judge.Caller, members: list[tuple[str, str, Interaction]], store: judge.Store
) -> list[dict[str, Any]]:
    """One call for ``members`` ((target type, ref, answer) each), scored relatively."""
    cfg = caller.cfg
    answers = [a for _, _, a in members]
    limit = max(2000, jt.MAX_TRANSCRIPT_CHARS * 2 // len(members))
    shared = None
    if all(a.request == answers[0].request for a in answers):  # choices of one request
        shared = jt.context(answers[0].request)
        convs = [jt.clip(jt.answer_text(a), limit) for a in answers]
    else:
        convs = [jt.transcript(a, limit=limit) for a in answers]
    verdicts = caller.ask(
        jt.group_prompt(cfg["rubric"], convs, shared), lambda t: jt.parse_group(t, len(members))
    )
    if verdicts is None:
        return []
    out = []
    for (target, ref, _), verdict in zip(members, verdicts, strict=True):
        fb = store(_scored("group", target, ref, verdict, cfg["model"]))
        out += [fb] if fb else []
    return out


# the judge as a reward source: rates whole sessions (never one answer, so never the eval
# gate's verifier); every parameter is the project's to set (session metadata sets none);
# the model, URL, key variable and caps are the operator's [judges.<name>] entry's
JUDGE = RewardSource(
    "judge",
    judge.JUDGE_PARAMS,
    rate_session=run_judge,
    grant=GrantRef("judge", "judges", Grants.judge, JudgeGrant),
    next_turn=NextTurn(judge_next_turn, applies=lambda spec: spec.get("mode") == "next_turn"),
    trusted_only=judge.JUDGE_PARAMS,
    check=judge.check_judge_params,
    feedback_source=FeedbackSource.judge,
)
