"""The LLM judge (trainer/judge.py, judge_run.py, judge_text.py) with litellm's own
``mock_response``: each mode, retries then skip-and-count for unparsable answers,
timeouts and provider errors, the budget, the never-recorded key check, idempotency.

The judge runs as the verifier task's body does (trainer.hooks.run_verifiers), on a
migrated SQLite database (and PostgreSQL where marked)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import litellm
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory
from core.keys import create_key, ensure_project
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import FeedbackRow, InteractionRow, JudgeCallRow
from tests.grants import grant, judge_spec
from tests.rows import interaction, session
from trainer import judge
from trainer.hooks import run_verifiers
from trainer.next_turn import run_next_turn

MODEL = "openai/judge-test"
_MP: list[pytest.MonkeyPatch] = []


@pytest.fixture(autouse=True)
def _monkeypatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _MP.append(monkeypatch)  # _project grants the judge for this test only
    yield
    _MP.clear()


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


class Mock:
    """Answers litellm.completion with the next scripted mock: a string is litellm's
    ``mock_response`` (also "litellm.InternalServerError" etc., which litellm raises),
    TIMEOUT is litellm's ``mock_timeout``."""

    TIMEOUT = object()

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        answer = self.answers.pop(0)
        if answer is Mock.TIMEOUT:
            return litellm.completion(**{**kwargs, "timeout": 0.05}, mock_timeout=True)
        return litellm.completion(**kwargs, mock_response=answer)


@pytest.fixture
def mock(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(*answers: Any) -> Mock:
        m = Mock(*answers)
        monkeypatch.setattr(judge, "_completion", m)
        monkeypatch.setattr(judge, "BACKOFF_S", 0.0)
        return m

    return install


def _project(factory: Any, pid: str = "p1", **params: Any) -> None:
    """The operator's judge entry ``j`` and the project's spec naming it, from ``params``."""
    entry, spec = judge_spec("j", {"model": MODEL, "retries": 2, **params})
    grant(_MP[0], judges={"j": entry})
    with factory() as db, db.begin():
        ensure_project(db, pid).settings = {"verifiers": [spec]}


def _add(factory: Any, sid: str, *turns: Any, pid: str = "p1", **fields: Any) -> None:
    with factory() as db, db.begin():
        db.add(to_row(session(sid, pid, status="closed", closed_at=utcnow(), **fields)))
        db.flush()
        for t in turns:
            db.add(to_row(t))


def _feedback(factory: Any) -> list[FeedbackRow]:
    with factory() as db:
        return list(db.scalars(select(FeedbackRow).order_by(FeedbackRow.created_at)).all())


def _outcomes(factory: Any) -> list[str]:
    with factory() as db:
        rows = db.scalars(select(JudgeCallRow).order_by(JudgeCallRow.created_at)).all()
        return [r.outcome for r in rows]


def _rewards(factory: Any) -> dict[str, float | None]:
    with factory() as db:
        return dict(db.execute(select(InteractionRow.id, InteractionRow.reward)).all())


def test_session_mode_stores_score_rationale_and_model(factory: Any, mock: Any) -> None:
    _project(factory, mode="session", rubric="Is the capital right?")
    _add(
        factory,
        "s1",
        interaction("s1-0", "s1", 0, "Let me look it up", question="Capital of France?"),
        interaction("s1-1", "s1", 1, "Paris.", question="Capital of France?"),
    )
    m = mock('{"score": 0.75, "rationale": "right city, terse"}')
    out = run_verifiers(factory, "s1")
    assert len(out) == 1 and len(m.calls) == 1
    prompt = m.calls[0]["messages"][-1]["content"]
    assert "Is the capital right?" in prompt and "Paris." in prompt
    assert "Capital of France?" in prompt
    (fb,) = _feedback(factory)
    assert (fb.source, fb.rater, fb.target_type, fb.target_id) == (
        "judge",
        "judge:session",
        "session",
        "s1",
    )
    assert (fb.value, fb.scale_min, fb.scale_max, fb.reward) == (0.75, 0.0, 1.0, 0.5)
    assert (fb.rationale, fb.judge_model) == ("right city, terse", MODEL)
    assert out[0]["rationale"] == "right city, terse" and out[0]["judge_model"] == MODEL
    assert _rewards(factory) == {"s1-0": 0.5, "s1-1": 0.5}  # credit assignment ran
    assert _outcomes(factory) == ["ok"]
    # a redelivered task does not call the judge again
    run_verifiers(factory, "s1")
    assert len(m.calls) == 1 and len(_feedback(factory)) == 1


def test_unparsable_is_retried_then_skipped_and_counted(factory: Any, mock: Any) -> None:
    _project(factory, mode="session", retries=2)
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock("Looks good to me!", '{"score": 7}', '{"verdict": "fine"}')
    assert run_verifiers(factory, "s1") == []
    assert len(m.calls) == 3  # 1 + 2 retries
    assert _outcomes(factory) == ["unparsable"] * 3
    assert _feedback(factory) == []  # no made-up score
    assert _rewards(factory) == {"s1-0": None}

    # an unparsable answer, then a good one: rated
    _add(factory, "s2", interaction("s2-0", "s2", 0, "43"))
    mock("```json\n{oops", '```json\n{"score": 1, "rationale": "ok"}\n```')
    assert len(run_verifiers(factory, "s2")) == 1
    assert _outcomes(factory)[-2:] == ["unparsable", "ok"]


def test_timeouts_and_provider_errors_are_retried_then_skipped(factory: Any, mock: Any) -> None:
    _project(factory, mode="session", retries=2)
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock("litellm.InternalServerError", Mock.TIMEOUT, "litellm.RateLimitError")
    assert run_verifiers(factory, "s1") == []  # no crash
    assert len(m.calls) == 3
    assert _outcomes(factory) == ["error", "timeout", "error"]
    assert _feedback(factory) == []
    with factory() as db:
        errors = db.scalars(select(JudgeCallRow.error)).all()
    assert any("InternalServerError" in (e or "") for e in errors)
    usage = judge.usage(factory, "p1")
    assert usage["calls"] == 3 and usage["outcomes"] == {"error": 2, "timeout": 1}


def test_group_mode_scores_the_choices_of_one_request_relatively(factory: Any, mock: Any) -> None:
    _project(factory, mode="group")
    answers = ["Paris", "Lyon, I think", "I don't know"]
    _add(
        factory,
        "g",
        *(
            interaction(f"g.{c}", "g", c, text, group_id="g", choice_index=c)
            for c, text in enumerate(answers)
        ),
    )
    scores = '{"scores": [{"id": 1, "score": 1, "rationale": "right"}, {"id": 2, "score": 0.5}, {"id": 3, "score": 0, "rationale": "gave up"}]}'  # noqa: E501
    m = mock(scores)
    out = run_verifiers(factory, "g")
    assert len(m.calls) == 1 and len(out) == 3  # the three siblings in one call
    prompt = m.calls[0]["messages"][-1]["content"]
    assert all(a in prompt for a in answers) and '<trajectory id="3">' in prompt
    assert prompt.count("USER: q") == 1  # the shared conversation once, then the answers
    got = {f.target_id: (f.target_type, f.value, f.reward, f.rationale) for f in _feedback(factory)}
    assert got == {
        "g.0": ("interaction", 1, 1.0, "right"),
        "g.1": ("interaction", 0.5, 0.0, None),
        "g.2": ("interaction", 0, -1.0, "gave up"),
    }
    assert _rewards(factory) == {"g.0": 1.0, "g.1": 0.0, "g.2": -1.0}


def test_group_answer_must_score_every_sibling(factory: Any, mock: Any) -> None:
    _project(factory, mode="group", retries=1)
    _add(
        factory,
        "g",
        *(interaction(f"g.{c}", "g", c, "x", group_id="g", choice_index=c) for c in range(2)),
    )
    m = mock(
        '{"scores": [{"id": 1, "score": 1}]}',
        '{"scores": [{"id": 1, "score": 1}, {"id": 1, "score": 0}]}',
    )  # noqa: E501
    assert run_verifiers(factory, "g") == []
    assert len(m.calls) == 2 and _outcomes(factory) == ["unparsable", "unparsable"]


def test_group_mode_waits_for_sibling_sessions_of_a_task(factory: Any, mock: Any) -> None:
    _project(factory, mode="group", group_size=2)
    _add(factory, "a", interaction("a-0", "a", 0, "first try"), task_id="t1")
    m = mock('{"scores": [{"id": 1, "score": 0.2}, {"id": 2, "score": 0.9, "rationale": "b"}]}')
    assert run_verifiers(factory, "a") == []  # one of two closed: no call yet
    assert m.calls == []
    _add(factory, "other", interaction("o-0", "other", 0, "x"), task_id="t2")  # other task
    _add(factory, "b", interaction("b-0", "b", 0, "second try"), task_id="t1")
    out = run_verifiers(factory, "b")
    assert len(m.calls) == 1 and len(out) == 2
    prompt = m.calls[0]["messages"][-1]["content"]
    assert "first try" in prompt and "second try" in prompt and "x\n" not in prompt
    got = {f.target_id: (f.target_type, f.reward) for f in _feedback(factory)}
    assert got == {"a": ("session", pytest.approx(-0.6)), "b": ("session", pytest.approx(0.8))}
    assert run_verifiers(factory, "a") == [] and len(m.calls) == 1  # judged once


def test_group_mode_without_siblings_is_not_scored(factory: Any, mock: Any) -> None:
    _project(factory, mode="group")
    _add(factory, "s", interaction("s-0", "s", 0, "alone"))  # no task, one answer
    m = mock()
    assert run_verifiers(factory, "s") == [] and m.calls == []


def _turn(sid: str, seq: int, messages: list[dict[str, Any]], text: str) -> Any:
    return interaction(f"{sid}-{seq}", sid, seq, text, request={"messages": messages})


def _arrived(factory: Any, sid: str) -> list[dict[str, Any]]:
    """The next-turn task for each turn of the session, in order, as the gateway enqueues
    them when each turn is recorded (trainer/next_turn.py)."""
    with factory() as db:
        q = select(InteractionRow.id).where(InteractionRow.session_id == sid)
        ids = list(db.scalars(q.order_by(InteractionRow.seq)).all())
    return [fb for i in ids for fb in run_next_turn(factory, sid, i)]


def test_next_turn_classifies_the_users_next_message(factory: Any, mock: Any) -> None:
    _project(factory, mode="next_turn")
    u0 = {"role": "user", "content": "What is 2+2?"}
    h1 = [u0, {"role": "assistant", "content": "4"}]
    u1 = {"role": "user", "content": "Thanks! And 3+3?"}
    h2 = [*h1, u1, {"role": "assistant", "content": "7"}]
    u2 = {"role": "user", "content": "No, 3+3 is 6."}
    h3 = [*h2, u2, {"role": "assistant", "content": "Right, 6."}]
    u3 = {"role": "user", "content": "What's the weather in Oslo?"}
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    h4 = [*h3, u3, {"role": "assistant", "content": None, "tool_calls": [call]}]
    tool = {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}
    _add(
        factory,
        "s",
        _turn("s", 0, [u0], "4"),
        _turn("s", 1, [*h1, u1], "7"),
        _turn("s", 2, [*h2, u2], "Right, 6."),
        _turn("s", 3, [*h3, u3], ""),
        _turn("s", 4, [*h4, tool], "It is -3 C in Oslo."),  # a tool result: no user reply
    )
    m = mock(
        '{"label": "satisfied", "rationale": "thanks"}',
        '{"label": "correction", "rationale": "user fixed the sum"}',
        '{"label": "new_topic", "rationale": "weather"}',
    )
    assert run_verifiers(factory, "s") == [] and m.calls == []  # not at the close
    out = _arrived(factory, "s")
    assert len(m.calls) == 3 and len(out) == 2
    assert "Thanks! And 3+3?" in m.calls[0]["messages"][-1]["content"]
    assert "No, 3+3 is 6." in m.calls[1]["messages"][-1]["content"]
    got = {f.target_id: (f.target_type, f.reward, f.comment, f.rater) for f in _feedback(factory)}
    assert got == {
        "s-0": ("interaction", 1.0, "next turn: satisfied", "judge:next_turn"),
        "s-1": ("interaction", -0.5, "next turn: correction", "judge:next_turn"),
    }  # new_topic: no rating of s-2
    rewards = _rewards(factory)
    assert (rewards["s-0"], rewards["s-1"], rewards["s-2"]) == (1.0, -0.5, None)


def test_next_turn_complaint_and_anthropic_shape(factory: Any, mock: Any) -> None:
    _project(factory, mode="next_turn")
    u0 = {"role": "user", "content": [{"type": "text", "text": "Fix the bug"}]}
    a0 = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    u1 = {"role": "user", "content": "This is useless, nothing changed."}
    turns = [
        interaction("s-0", "s", 0, "Done.", request={"system": "be brief", "messages": [u0]}),
        interaction("s-1", "s", 1, "Sorry", request={"messages": [u0, a0, u1]}),
    ]
    _add(factory, "s", *turns)
    m = mock('{"label": "Complaint", "rationale": "frustrated"}')
    _arrived(factory, "s")
    assert _arrived(factory, "s") == [] and len(m.calls) == 1  # a redelivery: judged once
    assert "nothing changed" in m.calls[0]["messages"][-1]["content"]
    (fb,) = _feedback(factory)
    assert (fb.target_id, fb.reward, fb.rationale) == ("s-0", -1.0, "frustrated")


def test_budget_calls_per_hour(factory: Any, mock: Any) -> None:
    _project(factory, mode="session", calls_per_hour=2, retries=0)
    for sid in ("s1", "s2", "s3"):
        _add(factory, sid, interaction(f"{sid}-0", sid, 0, "42"))
    m = mock('{"score": 1}', '{"score": 0}')
    for sid in ("s1", "s2", "s3"):
        run_verifiers(factory, sid)
    assert len(m.calls) == 2  # the third is refused before any call
    assert _outcomes(factory) == ["ok", "ok", "budget"]
    assert {f.target_id for f in _feedback(factory)} == {"s1", "s2"}
    usage = judge.usage(factory, "p1")
    assert usage["calls"] == 2 and usage["outcomes"]["budget"] == 1


def test_budget_judge_seconds_per_hour(factory: Any, mock: Any) -> None:
    """A custom api_base has no price: the entry's wall-time cap binds, timeouts included."""
    _project(factory, mode="session", seconds_per_hour=30, api_base="http://127.0.0.1:9/v1")
    with factory() as db, db.begin():  # an earlier call that hung for 31 s
        db.add(
            JudgeCallRow(
                id="jc_slow", project_id="p1", mode="session", model=MODEL, outcome="timeout",
                attempt=1, latency_ms=31_000, created_at=utcnow(),
            )
        )  # fmt: skip
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock()
    assert run_verifiers(factory, "s1") == [] and m.calls == []
    assert _outcomes(factory) == ["timeout", "budget"]
    assert judge.usage(factory, "p1")["seconds"] == pytest.approx(31.0)


def test_no_call_starts_past_the_tasks_deadline(factory: Any, mock: Any) -> None:
    import time

    _project(factory, mode="session", timeout_s=60)
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock('{"score": 1}')
    assert run_verifiers(factory, "s1", deadline=time.monotonic() + 0.5) == []
    assert m.calls == [] and _outcomes(factory) == ["budget"]
    run_verifiers(factory, "s1", deadline=time.monotonic() + 20)  # the call's timeout shrinks
    assert 1 <= m.calls[0]["timeout"] <= 20


def test_budget_usd_per_hour(factory: Any, mock: Any) -> None:
    _project(factory, mode="session", usd_per_hour=0.01)
    with factory() as db, db.begin():  # an earlier, priced call spent the hour's budget
        db.add(
            JudgeCallRow(
                id="jc_old", project_id="p1", mode="session", model=MODEL, outcome="ok",
                attempt=1, cost_usd=0.02, created_at=utcnow(),
            )
        )  # fmt: skip
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock()
    assert run_verifiers(factory, "s1") == [] and m.calls == []
    assert _outcomes(factory) == ["ok", "budget"]
    assert judge.usage(factory, "p1")["cost_usd"] == pytest.approx(0.02)


def test_a_key_of_the_judged_project_is_refused(
    factory: Any, mock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through an rlgate gateway, the judge's calls are recorded in its key's project:
    never the judged one."""
    _project(
        factory, mode="session", api_base="http://127.0.0.1:9/v1", api_key_env="RLGATE_JUDGE_KEY"
    )  # the operator's entry: URL and key variable
    with factory() as db, db.begin():
        ensure_project(db, "judges")
        _, own = create_key(db, "p1", "agent")
        _, other = create_key(db, "judges", "agent")
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock('{"score": 1, "rationale": "ok"}')
    monkeypatch.setenv("RLGATE_JUDGE_KEY", own)
    assert run_verifiers(factory, "s1") == [] and m.calls == []
    assert _outcomes(factory) == ["refused"]
    monkeypatch.setenv("RLGATE_JUDGE_KEY", other)
    assert len(run_verifiers(factory, "s1")) == 1
    assert m.calls[0]["api_key"] == other and m.calls[0]["api_base"] == "http://127.0.0.1:9/v1"
    monkeypatch.delenv("RLGATE_JUDGE_KEY")
    _add(factory, "s2", interaction("s2-0", "s2", 0, "42"))
    assert run_verifiers(factory, "s2") == []  # the key's variable is not set: counted
    assert _outcomes(factory)[-1] == "refused"


def test_api_base_never_gets_a_provider_key_from_the_environment(
    factory: Any, mock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-secret")
    _project(factory, mode="session", api_base="http://127.0.0.1:9/v1")
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    m = mock('{"score": 1}')
    run_verifiers(factory, "s1")
    assert m.calls[0]["api_key"] == "no-key"


def test_session_metadata_cannot_configure_the_judge(factory: Any, mock: Any) -> None:
    """An agent key writes session metadata: it may name the judge, never its model, URL,
    key or budget."""
    with factory() as db, db.begin():
        ensure_project(db, "p1")
    meta = {"verifier": {"name": "judge", "model": "openai/x", "api_base": "http://evil/v1"}}
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"), metadata=meta)
    m = mock()
    assert run_verifiers(factory, "s1") == [] and m.calls == []
    # with the project's judge, the session's parameters are ignored
    _project(factory, mode="session")
    m = mock('{"score": 1}')
    assert len(run_verifiers(factory, "s1")) == 1
    assert "api_base" not in m.calls[0] and m.calls[0]["model"] == MODEL


def test_mock_response_from_the_environment(factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """RLGATE_JUDGE_MOCK_RESPONSE (what the worker test uses) is litellm's mock_response."""
    monkeypatch.setenv(judge.MOCK_ENV, '{"score": 0.25, "rationale": "from env"}')
    _project(factory, mode="session")
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))
    (fb,) = run_verifiers(factory, "s1")
    assert (fb["reward"], fb["rationale"]) == (-0.5, "from env")


def test_group_of_sessions_on_postgres(pg_factory: Any, mock: Any) -> None:
    _project(pg_factory, mode="group", group_size=2)
    for sid, text in (("a", "one"), ("b", "two")):
        _add(pg_factory, sid, interaction(f"{sid}-0", sid, 0, text), task_id="t")
    m = mock('{"scores": [{"id": 1, "score": 1, "rationale": "r1"}, {"id": 2, "score": 0}]}')
    assert len(run_verifiers(pg_factory, "b")) == 2
    got = {f.target_id: (f.reward, f.rationale, f.judge_model) for f in _feedback(pg_factory)}
    assert got == {"a": (1.0, "r1", MODEL), "b": (-1.0, None, MODEL)}
    assert _rewards(pg_factory) == {"a-0": 1.0, "b-0": -1.0}
    assert run_verifiers(pg_factory, "a") == [] and len(m.calls) == 1


def test_a_judge_failure_never_raises(factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _project(factory, mode="session", retries=0)
    _add(factory, "s1", interaction("s1-0", "s1", 0, "42"))

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("provider exploded")

    monkeypatch.setattr(judge, "_completion", broken)
    monkeypatch.setattr(judge, "BACKOFF_S", 0.0)
    assert run_verifiers(factory, "s1") == []
    assert _outcomes(factory) == ["error"]
    # and a crash inside the judge's own code is logged, not raised
    monkeypatch.setattr("trainer.judge_run.turns", lambda _: 1 / 0)
    assert run_verifiers(factory, "s1") == []


def test_where_each_turns_credit_came_from(factory: Any, mock: Any) -> None:
    """trainer.api.session_credit: the level that decided each turn's reward, the ratings
    behind it with their origin, and the judge's rationale (the session view's data)."""
    from core.feedback import FeedbackInput, Scope, store_feedback
    from trainer.api import learning_curve, session_credit
    from trainer.hooks import after_feedback

    _project(factory, mode="next_turn")
    u0, a0 = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}
    u1 = {"role": "user", "content": "Wrong, it is 4."}
    a1 = {"role": "assistant", "content": "Yes, 4."}
    u2 = {"role": "user", "content": "Now 5+5?"}
    _add(
        factory,
        "s",
        _turn("s", 0, [u0], "5"),
        _turn("s", 1, [u0, a0, u1], "Yes, 4."),
        _turn("s", 2, [u0, a0, u1, a1, u2], "10"),
    )
    mock(
        '{"label": "correction", "rationale": "the user corrected 5 to 4"}', *['{"label": "x"}'] * 3
    )
    _arrived(factory, "s")  # the second answer is unparsable (retries 2, then skipped)
    row, _ = store_feedback(
        factory,
        FeedbackInput("session", "s", 1, "binary", None, None, 1.0, rater="alice"),
        Scope("p1"),
        wait_s=0,
    )
    after_feedback(factory, row)
    view = session_credit(factory, "s")
    assert view is not None and view["project_id"] == "p1" and view["gamma"] == 1.0
    t0, t1, t2 = view["turns"]
    assert (t0["level"], t0["reward"], t0["origins"]) == ("interaction", -0.5, ["next_turn"])
    assert t0["ratings"][0]["rationale"] == "the user corrected 5 to 4"
    assert t0["ratings"][0]["judge_model"] == MODEL
    assert (t1["level"], t1["reward"], t1["origins"], t1["discount"]) == (
        "session",
        1.0,
        ["user"],
        1.0,
    )
    assert t2["level"] == "session" and t2["ratings"][0]["rater"] == "alice"
    assert session_credit(factory, "nope") is None
    (base,) = learning_curve(factory, "p1")
    assert (base["policy_version"], base["version"], base["requests"], base["rated"]) == (
        "base",
        0,
        3,
        3,
    )
    assert base["mean_reward"] == pytest.approx(0.5)
