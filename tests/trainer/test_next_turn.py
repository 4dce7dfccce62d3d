"""The user's next message as a rating (trainer/next_turn_rules.py, trainer/next_turn.py):
the rule classifier on each label and on neutral messages; the next-turn task's body on a
migrated SQLite database (PostgreSQL where marked) rating the earlier answer while the
session is open, idempotent on a redelivery, and nothing at the close; the gateway's
dispatch (gateway/recording/next_turn.py) and the recorder's hand-over of the turns it committed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory
from core.keys import ensure_project
from core.migrate import upgrade
from schemas.convert import to_row
from schemas.tables import FeedbackRow, InteractionRow
from tests.grants import grant, judge_spec
from tests.rows import interaction, session
from trainer import next_turn_rules as rules
from trainer.credit_view import session_credit
from trainer.eval_gate import GateConfigError
from trainer.hooks import on_session_closed, run_verifiers
from trainer.next_turn import pair_for, reads_next_turn, run_next_turn
from trainer.verifiers import VerifierSpecError, check_specs

RULES = {"verifiers": [{"name": "next_turn_rules"}]}

# ---- the classifier -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "label", "cue"),
    [
        ("No, that's wrong.", "correction", "no"),
        ("That is incorrect, the capital is Canberra", "correction", "incorrect"),
        ("Actually, it was 1969.", "correction", "actually"),
        ("I meant the other file", "correction", "i meant"),
        ("That's not what I asked", "correction", "not what i asked"),
        ("Use a list comprehension instead", "correction", "instead"),
        ("This is useless", "complaint", "useless"),
        ("Way too long, I just need the number", "complaint", "too long"),
        ("You didn't answer my question", "complaint", "you didn't"),
        ("Stop apologizing and fix it", "complaint", "stop"),
        ("Thanks, but you didn\u2019t run the tests", "complaint", "you didn't"),  # curly quote
        ("No, this still doesn't work", "complaint", "doesn't work"),  # the worse one wins
        ("Thanks!", "thanks", "thanks"),
        ("Perfect, that works.", "thanks", "perfect"),
        ("great, now add a test for it", "thanks", "great"),
        ("Thank you so much", "thanks", "thank you"),
    ],
)
def test_each_label_and_its_cue(reply: str, label: str, cue: str) -> None:
    got = rules.classify(reply, "How do I reverse a list in Python?")
    assert got is not None and (got.label, got.cue) == (label, cue)
    assert got.reward == {"thanks": 1.0, "correction": -0.5, "complaint": -1.0}[label]
    assert rules.comment(got) == f'next turn: {label} (cue: "{cue}")'


@pytest.mark.parametrize(
    "reply",
    [
        "What is the capital of Peru?",  # a new question
        "Can you also sort it afterwards?",  # a follow-up on the answer
        "No problem, next one: 3+3?",  # "no" that is not a correction
        "Not great.",  # no thanks; no cue of its own
        "ok",
        "",
    ],
)
def test_neutral_messages_give_no_rating(reply: str) -> None:
    assert rules.classify(reply, "How do I reverse a list in Python?") is None


def test_a_repeated_question_and_its_threshold() -> None:
    before = "How do I reverse a list in Python?"
    got = rules.classify("how do I reverse a python list", before)
    assert got is not None and got.label == "repeat" and got.reward == -0.5
    assert "word overlap" in got.cue
    assert rules.classify("how do I reverse a python list", before, 0.95) is None
    assert rules.classify("How do I sort a dict by value in Go?", before) is None
    assert rules.classify("ok", "ok") is None  # too few words to be the same question
    # a negative cue says more than the overlap; thanks with the same words is a repeat
    assert rules.classify("No, how do I reverse a list in Python?", before).label == "correction"  # type: ignore[union-attr]


def test_only_the_start_of_a_long_message_is_read() -> None:
    pasted = "Here is the log:\n" + "x " * 400 + "this is useless"
    assert rules.classify(pasted) is None


# ---- the settings -----------------------------------------------------------------------------


def test_specs_and_the_eval_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_specs([{"name": "next_turn_rules", "repeat_similarity": 0.8}])
    with pytest.raises(VerifierSpecError, match=r"repeat_similarity must be a number in 0.3..1"):
        check_specs([{"name": "next_turn_rules", "repeat_similarity": 2}])
    with pytest.raises(VerifierSpecError, match="unknown parameters"):
        check_specs([{"name": "next_turn_rules", "lexicon": ["meh"]}])
    assert reads_next_turn(RULES) and not reads_next_turn({"verifiers": ["contains"]})
    entry, spec = judge_spec("j", {"model": "openai/j"})
    grant(monkeypatch, judges={"j": entry})
    assert reads_next_turn({"verifiers": [{**spec, "mode": "next_turn"}]})
    assert not reads_next_turn({"verifiers": [{**spec, "mode": "session"}]})
    assert not reads_next_turn(None)
    from trainer.eval_gate import EvalGate

    with pytest.raises(GateConfigError, match="next message"):
        EvalGate.parse({"verifier": "next_turn_rules", "prompts": [{"prompt": "q"}]})


# ---- the task's body --------------------------------------------------------------------------


@pytest.fixture
def factory(sqlite_url: str) -> Iterator[Any]:
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def pg_factory(pg_url: str) -> Iterator[Any]:
    upgrade(pg_url)
    engine = make_engine(pg_url)
    yield session_factory(engine)
    engine.dispose()


def _chat(factory: Any, sid: str, *turns: tuple[str, str], settings: Any = RULES) -> list[str]:
    """An open session of chat turns (user message, answer), each request carrying the
    conversation before it, as a chat client sends it; returns the interaction ids."""
    messages: list[dict[str, Any]] = []
    ids = []
    with factory() as db, db.begin():
        ensure_project(db, "p1").settings = settings
        db.add(to_row(session(sid, "p1")))
        db.flush()
        for seq, (question, answer) in enumerate(turns):
            messages = [*messages, {"role": "user", "content": question}]
            iid = f"{sid}-{seq}"
            db.add(to_row(interaction(iid, sid, seq, answer, request={"messages": messages})))
            messages = [*messages, {"role": "assistant", "content": answer}]
            ids.append(iid)
    return ids


def _feedback(factory: Any) -> list[FeedbackRow]:
    with factory() as db:
        return list(db.scalars(select(FeedbackRow).order_by(FeedbackRow.created_at)).all())


def _rewards(factory: Any) -> dict[str, float | None]:
    with factory() as db:
        return dict(db.execute(select(InteractionRow.id, InteractionRow.reward)).all())


def _correction_rates_the_answer_before(factory: Any) -> None:
    i0, i1 = _chat(factory, "s", ("Capital of Australia?", "Sydney"), ("No, that's wrong.", "Oh"))
    assert run_next_turn(factory, "s", i0) == []  # the first turn follows nothing
    (out,) = run_next_turn(factory, "s", i1)
    (fb,) = _feedback(factory)
    assert (fb.target_type, fb.target_id, fb.session_id) == ("interaction", i0, "s")
    assert (fb.source, fb.rater, fb.reward, fb.value) == (
        "next_turn",
        "rules:next_turn",
        -0.5,
        -0.5,
    )
    assert fb.comment == 'next turn: correction (cue: "no")'
    assert fb.idempotency_key == f"next_turn:rules:{i0}" and out["id"] == fb.id
    assert _rewards(factory) == {i0: -0.5, i1: None}  # credit assigned, the session open
    # a redelivered task writes nothing twice
    run_next_turn(factory, "s", i1)
    assert len(_feedback(factory)) == 1
    # the credit view names the rules as the origin
    view = session_credit(factory, "s")
    assert view is not None
    t0 = view["turns"][0]
    assert (t0["level"], t0["origins"], t0["reward"]) == ("interaction", ["next_turn_rules"], -0.5)
    assert t0["ratings"][0]["origin_text"] == "the rules reading the user's next message"


def test_a_correction_rates_the_answer_before_it(factory: Any) -> None:
    _correction_rates_the_answer_before(factory)


@pytest.mark.slow
def test_a_correction_rates_the_answer_before_it_on_postgresql(pg_factory: Any) -> None:
    _correction_rates_the_answer_before(pg_factory)


def test_thanks_neutral_and_nothing_at_the_close(
    factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _chat(
        factory,
        "s",
        ("2+2?", "4"),
        ("Thanks! And 3+3?", "6"),
        ("What is the capital of Peru?", "Lima"),  # neutral: no rating of "6"
    )
    for i in ids:
        run_next_turn(factory, "s", i)
    assert _rewards(factory) == {ids[0]: 1.0, ids[1]: None, ids[2]: None}
    sent: list[str] = []
    monkeypatch.setattr("trainer.hooks.enqueue_verification", sent.append)
    assert run_verifiers(factory, "s") == []  # the rules do not run at the close
    assert on_session_closed(factory, "s") is False and sent == []  # nor is a task queued
    assert len(_feedback(factory)) == 1


def test_a_project_without_a_next_turn_source_is_not_rated(factory: Any) -> None:
    i0, i1 = _chat(
        factory, "s", ("2+2?", "5"), ("No, that's wrong", "4"), settings={"verifiers": ["contains"]}
    )
    assert run_next_turn(factory, "s", i1) == [] and _feedback(factory) == []


def test_pairs_across_api_shapes(factory: Any) -> None:
    """A tool result is no user message; a Responses turn with ``previous_response_id``
    carries only the new input and names its answer as the parent."""
    with factory() as db, db.begin():
        ensure_project(db, "p1").settings = RULES
        db.add(to_row(session("s", "p1")))
        db.flush()
        u0 = {"role": "user", "content": "Weather in Oslo?"}
        call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
        a0 = {"role": "assistant", "content": None, "tool_calls": [call]}
        tool = {"role": "tool", "tool_call_id": "c1", "content": "thanks"}
        db.add(to_row(interaction("s-0", "s", 0, "", request={"messages": [u0]})))
        db.add(to_row(interaction("s-1", "s", 1, "-3 C", request={"messages": [u0, a0, tool]})))
        db.add(
            to_row(
                interaction(
                    "s-2", "s", 2, "ok", parent_id="s-1", request={"input": "perfect, thanks"}
                )
            )
        )
    with factory() as db:
        rows = db.scalars(select(InteractionRow).order_by(InteractionRow.seq)).all()
        from schemas.convert import to_record

        records = [to_record(r) for r in rows]
    assert pair_for(records, "s-1") is None  # a tool result
    pair = pair_for(records, "s-2")
    assert pair is not None and (pair.answer.id, pair.reply) == ("s-1", "perfect, thanks")
    run_next_turn(factory, "s", "s-2")
    assert _rewards(factory)["s-1"] == 1.0


# ---- the gateway's side ---------------------------------------------------------------------


def test_the_dispatch_queues_only_for_projects_with_a_next_turn_source(factory: Any) -> None:
    from gateway.recording.next_turn import NextTurnDispatch
    from gateway.recording.record_batch import Followup

    with factory() as db, db.begin():
        ensure_project(db, "rules").settings = RULES
        ensure_project(db, "plain").settings = {"verifiers": ["contains"]}
    sent: list[tuple[str, str]] = []
    dispatch = NextTurnDispatch(factory, ttl_s=60, enqueue=lambda s, i: sent.append((s, i)))
    turns = [Followup("rules", "s1", "i1"), Followup("plain", "s2", "i2")]
    assert dispatch.dispatch(turns) == 1 and sent == [("s1", "i1")]
    with factory() as db, db.begin():  # cached for ttl_s: no read per turn
        ensure_project(db, "plain").settings = RULES
    assert dispatch.dispatch([Followup("plain", "s2", "i3")]) == 0
    dispatch.ttl_s = 0
    assert dispatch.dispatch([Followup("plain", "s2", "i3")]) == 1

    def down(s: str, i: str) -> None:
        raise ConnectionError("broker down")

    dispatch.enqueue = down
    assert dispatch.dispatch([Followup("rules", "s1", "i4")]) == 0 and dispatch.dropped == 1


def test_the_recorder_hands_over_committed_follow_up_turns(factory: Any, tmp_path: Path) -> None:
    """Through the real recorder: a session's second turn (and a stitched turn with a
    parent) is handed over after its commit; a first turn, an aborted one and the second
    choice of n > 1 are not."""
    import asyncio

    from gateway.recording.recorder import Recorder

    with factory() as db, db.begin():
        ensure_project(db, "p1")
    got: list[Any] = []
    rec = Recorder(factory, tmp_path / "spool", fsync=False, on_followups_written=got.extend)
    rec.start()
    new = session("s", "p1").model_dump(mode="json")

    def item(i: Any, opened: Any = None) -> Any:
        return {"interaction": i.model_dump(mode="json"), "session": opened}

    async def go() -> None:
        await rec.record([item(interaction("a0", "s", 0), new)])
        await rec.record(
            [
                item(interaction("a1", "s", 1, group_id="g", choice_index=0)),
                item(interaction("a1b", "s", 1, group_id="g", choice_index=1)),
            ]
        )
        await rec.record([item(interaction("a2", "s", 2, finish_reason="abort"))])

    try:
        asyncio.run(go())
        assert rec.flush(30)
    finally:
        rec.stop()
    assert [(f.project_id, f.session_id, f.interaction_id) for f in got] == [("p1", "s", "a1")]
