"""The judge's settings are data: a registered name with checked parameters (pure
functions, no database), and what the judge reads and must answer (trainer/judge_text.py)."""

from __future__ import annotations

from typing import Any

import pytest

from core.grants import JudgeGrant
from tests.grants import grant
from tests.rows import interaction
from trainer import judge_text as jt
from trainer.eval_gate import EvalGate, GateConfigError
from trainer.judge import judge_settings
from trainer.verifiers import VerifierSpecError, check_specs, get_verifier, verifier_names

GOOD = {"name": "judge", "judge": "mini", "mode": "group", "rubric": "Be right."}
MINI = {"model": "openai/gpt-4o-mini", "api_key_env": "OPENAI_API_KEY", "projects": ["p1"]}


@pytest.fixture(autouse=True)
def _mini(monkeypatch: pytest.MonkeyPatch) -> None:
    grant(monkeypatch, judges={"mini": MINI, "other": {"model": "openai/x"}})


def test_judge_is_a_registered_name_that_scores_no_single_answer() -> None:
    assert "judge" in verifier_names()
    assert get_verifier("judge") is None  # it rates sessions, in the verifier task
    with pytest.raises(GateConfigError, match="rates whole sessions"):
        EvalGate.parse({"enabled": True, "verifier": "judge", "prompts": [{"prompt": "x"}]})


def test_a_good_spec_and_its_defaults_over_the_operators_entry() -> None:
    assert check_specs([GOOD], project_id="p1") == [GOOD]
    full = {**GOOD, "group_size": 8, "temperature": 0.2, "max_tokens": 256}
    assert check_specs(full, project_id="p1") == [full]
    cfg = judge_settings({"judge": "mini"}, JudgeGrant(**MINI))
    assert (cfg["model"], cfg["api_key_env"], cfg["api_base"]) == (
        "openai/gpt-4o-mini",
        "OPENAI_API_KEY",
        None,
    )
    assert (cfg["mode"], cfg["retries"], cfg["calls_per_hour"], cfg["usd_per_hour"]) == (
        "session",
        1,
        120,
        None,
    )
    assert cfg["seconds_per_hour"] == 600 and cfg["timeout_s"] == 60


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"mode": "pairwise"}, "mode must be one of ['group', 'session', 'next_turn']"),
        ({"judge": None}, "judge must name one of the operator's [judges] entries"),
        ({"judge": "nope"}, "(granted to this project: ['mini', 'other']), not 'nope'"),
        ({"rubric": ["be", "right"]}, "rubric must be text"),
        ({"rubric": ""}, "rubric must be text"),
        ({"rubric": "x" * 9000}, "rubric must be text"),
        ({"temperature_c": 1}, "unknown parameters ['temperature_c']"),
        ({"module": "os:system"}, "unknown parameters ['module']"),
        ({"group_size": 1}, "group_size must be an integer in 2..16"),
        # what only the operator sets: a model (a provider, so a credential), a URL, a key
        # variable, the caps
        ({"model": "openai/gpt-4o"}, "['model'] are the operator's to set"),
        ({"api_base": "http://127.0.0.1:9/v1"}, "['api_base'] are the operator's to set"),
        ({"api_key_env": "RLGATE_JUDGE_KEY"}, "['api_key_env'] are the operator's"),
        ({"calls_per_hour": 10**6, "timeout_s": 600}, "['calls_per_hour', 'timeout_s'] are"),
        ({"retries": 5, "usd_per_hour": 1e4}, "['retries', 'usd_per_hour'] are the operator's"),
    ],
)
def test_bad_judge_specs_say_what_to_fix(change: dict[str, Any], fragment: str) -> None:
    spec = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(VerifierSpecError) as e:
        check_specs([spec], project_id="p1")
    assert fragment in str(e.value)


def test_an_entry_serves_only_the_projects_it_is_granted_to() -> None:
    with pytest.raises(VerifierSpecError, match=r"\[judges.mini\] is not granted to project 'p2'"):
        check_specs([GOOD], project_id="p2")
    assert check_specs([{**GOOD, "judge": "other"}], project_id="p2")


def test_one_judge_per_project() -> None:
    with pytest.raises(VerifierSpecError, match="at most once"):
        check_specs([GOOD, {**GOOD, "mode": "next_turn"}], project_id="p1")


# ---- what the judge reads --------------------------------------------------------------------


def test_transcripts_of_the_three_apis() -> None:
    chat = interaction(
        "a",
        "s",
        0,
        "It is 18 C.",
        request={
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            ]
        },
    )
    text = jt.transcript(chat)
    assert "SYSTEM: be brief" in text and "USER: Weather in Paris?" in text
    assert text.endswith("ASSISTANT (rated answer): It is 18 C.")
    anthropic = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "name": "ls", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "content": "a.txt"}]},
        ],
    }
    roles = [r for r, _ in jt.request_messages(anthropic)]
    assert roles == ["system", "user", "assistant", "tool"]
    responses = {
        "instructions": "inst",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "output": "42"},
        ],
    }
    assert jt.request_messages(responses) == [
        ("system", "inst"),
        ("user", "hi"),
        ("assistant", "[calls tool f({})]"),
        ("tool", "42"),
    ]
    assert jt.request_messages({"input": "plain"}) == [("user", "plain")]
    long = interaction("b", "s", 0, "y" * 50_000)
    assert len(jt.transcript(long)) < jt.MAX_TRANSCRIPT_CHARS + 200


def test_next_user_message() -> None:
    def turn(messages: list[dict[str, Any]]) -> Any:
        return interaction("x", "s", 1, "", request={"messages": messages})

    u, a = {"role": "user", "content": "q"}, {"role": "assistant", "content": "4"}
    assert jt.next_user_message(turn([u, a, {"role": "user", "content": "wrong!"}])) == "wrong!"
    assert jt.next_user_message(turn([u])) is None  # no earlier answer
    assert jt.next_user_message(turn([u, a, {"role": "tool", "content": "r"}])) is None


def test_parsers() -> None:
    assert jt.parse_session('{"score": 0.5, "rationale": "ok"}') == jt.Verdict(0.5, "ok")
    assert jt.parse_session('Sure!\n```json\n{"score": 1}\n```') == jt.Verdict(1.0, "")
    for bad in (None, "", "0.5", '{"score": 1.5}', '{"score": true}', '{"score": "0.5"}', "[1]"):
        assert jt.parse_session(bad) is None
    two = '{"scores": [{"id": 2, "score": 0}, {"id": "1", "score": 1, "rationale": "r"}]}'
    assert jt.parse_group(two, 2) == [jt.Verdict(1.0, "r"), jt.Verdict(0.0, "")]
    assert jt.parse_group(two, 3) is None  # one missing
    assert jt.parse_group('{"scores": [{"id": 3, "score": 1}]}', 1) is None
    assert jt.parse_next_turn('{"label": "new topic"}') == jt.Verdict(0.0, "", "new_topic")
    assert jt.parse_next_turn('{"label": "correction"}') == jt.Verdict(-0.5, "", "correction")
    assert jt.parse_next_turn('{"label": "meh"}') is None
