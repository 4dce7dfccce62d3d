"""The ``json_valid`` verifier: registered in one place (trainer/builtin_verifiers.py),
found by name, its parameter checked like any spec's, and usable by the eval gate."""

from __future__ import annotations

import pytest

from tests.rows import interaction, session
from trainer.eval_gate import EvalGate
from trainer.reward_registry import REGISTRY, rates_sessions
from trainer.verifiers import (
    VerifierContext,
    VerifierSpecError,
    check_specs,
    configured_verifiers,
    get_verifier,
    verifier_names,
)


def score(text: str, **params: object) -> float | None:
    fn = get_verifier("json_valid")
    assert fn is not None
    ctx = VerifierContext(session("s"), [], {"name": "json_valid", **params})
    return fn(ctx, interaction("a", "s", 0, text))


def test_registered_once_and_found_by_name() -> None:
    assert "json_valid" in verifier_names() and "json_valid" in REGISTRY
    assert REGISTRY["json_valid"].params == ("require_keys",)
    assert not rates_sessions("json_valid")  # an answer verifier: the eval gate may use it
    gate = {"enabled": True, "verifier": "json_valid", "prompts": [{"prompt": "{}?"}]}
    assert EvalGate.parse(gate).verifier == "json_valid"


@pytest.mark.parametrize(
    ("text", "params", "want"),
    [
        ('{"a": 1}', {}, 1.0),
        ("[1, 2]", {}, 1.0),
        ('```json\n{"a": 1}\n```', {}, 1.0),
        ("{'a': 1}", {}, -1.0),
        ("sure! {}", {}, -1.0),
        ("", {}, -1.0),
        ('{"a": 1, "b": 2}', {"require_keys": ["a", "b"]}, 1.0),
        ('{"a": 1}', {"require_keys": ["a", "b"]}, -1.0),
        ("[1]", {"require_keys": ["a"]}, -1.0),
    ],
)
def test_scores(text: str, params: dict[str, object], want: float) -> None:
    assert score(text, **params) == want


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"name": "json_valid", "require_keys": "a"}, "require_keys must be a list"),
        ({"name": "json_valid", "require_keys": [1]}, "require_keys must be a list"),
        ({"name": "json_valid", "schema_url": "http://x"}, "unknown parameters ['schema_url']"),
    ],
)
def test_bad_specs_say_what_to_fix(spec: dict[str, object], fragment: str) -> None:
    with pytest.raises(VerifierSpecError) as e:
        check_specs([spec])
    assert fragment in str(e.value)


def test_project_spec_runs_and_session_may_name_it() -> None:
    project = {"verifiers": [{"name": "json_valid", "require_keys": ["answer"]}]}
    assert check_specs(project["verifiers"]) == project["verifiers"]
    specs = configured_verifiers(project, {"verifier": "json_valid"})
    assert specs == [{"name": "json_valid", "require_keys": ["answer"]}]
