"""Verifier settings (project ``settings["verifiers"]``, session metadata) name only
registered verifiers, with known, bounded parameters, and commands only by the name of
an operator entry; anything else is never run."""

from __future__ import annotations

import pytest

from tests.grants import grant
from tests.rows import interaction, session
from trainer.verifiers import (
    MAX_SPECS,
    VerifierContext,
    VerifierSpecError,
    check_specs,
    configured_verifiers,
    contains,
    get_verifier,
    project_params,
    verifier_names,
)


@pytest.fixture(autouse=True)
def _tests_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    grant(monkeypatch, commands={"tests": {"command": ["pytest", "-q"], "timeout_s": 30}})


def test_registry_names_and_lookup() -> None:
    assert {"exact_number", "contains", "command"} <= verifier_names()
    assert get_verifier("contains") is contains
    for name in ("pydoc:pipepager", "os:system", "subprocess.call", "", None, 3):
        assert get_verifier(name) is None  # type: ignore[arg-type]


def test_contains_verifier() -> None:
    ctx = VerifierContext(session("s", metadata={"expected": " Paris "}), [], {})
    assert contains(ctx, interaction("a", "s", 0, "It is paris.")) == 1.0
    assert contains(ctx, interaction("b", "s", 0, "Lyon")) == -1.0
    empty = VerifierContext(session("s", metadata={}), [], {})
    assert contains(empty, interaction("c", "s", 0, "Lyon")) is None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("pydoc:pipepager", "registered verifier"),
        ({"name": "no_such_verifier"}, "no verifier 'no_such_verifier' is registered"),
        ({"command": "id"}, "registered verifier"),  # no name
        ({"name": "exact_number", "module": "os"}, "unknown parameters ['module']"),
        ({"name": "command"}, "use must name one of the operator's [commands] entries"),
        ({"name": "command", "use": "nope"}, "(granted to this project: ['tests']), not 'nope'"),
        ({"name": "command", "use": "tests", "timeout_s": 10}, "['timeout_s'] are the operator's"),
        ({"name": "command", "command": "id"}, "['command'] are the operator's to set"),
        ({"name": "command", "cwd": "/", "env": {"A": "1"}}, "['cwd', 'env'] are the operator's"),
        (["exact_number"] * (MAX_SPECS + 1), f"at most {MAX_SPECS} verifiers"),
        (42, "must be a verifier name or an object"),
    ],
)
def test_bad_specs_are_refused(raw: object, fragment: str) -> None:
    with pytest.raises(VerifierSpecError) as e:
        check_specs(raw)
    assert fragment in str(e.value)


def test_good_specs() -> None:
    specs = check_specs(
        [
            "exact_number",
            {"name": "command", "use": "tests", "expected": "ok"},
        ]
    )
    assert [s["name"] for s in specs] == ["exact_number", "command"]


def test_invalid_specs_are_skipped_never_run() -> None:
    good = {"name": "command", "use": "tests"}
    stored = [good, "pydoc:pipepager", {"name": "command", "command": "id"}]
    project = {"verifiers": stored}
    # the project's valid spec stays; the one naming a module, and one carrying a command
    # (stored before operator grants existed), are dropped
    assert configured_verifiers(project, {}) == [good]
    meta = {"verifiers": ["os:system", {"name": "exact_number", "expected": 3}]}
    assert configured_verifiers({}, meta) == [{"name": "exact_number", "expected": 3}]
    # only the first MAX_SPECS of a long list
    many = {"verifiers": ["exact_number"] * (MAX_SPECS + 5)}
    assert len(configured_verifiers({}, many)) == MAX_SPECS
    # the gate's parameters come from the project's valid specs only
    assert project_params(project, "command") == {"use": "tests"}
    assert project_params(project, "pydoc:pipepager") == {}
