"""Verifier settings (project ``settings["verifiers"]``, session metadata) name only
registered verifiers, with known, bounded parameters; anything else is never run."""

from __future__ import annotations

import pytest

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
        ({"name": "command", "timeout_s": 10**6}, "timeout_s must be a number of seconds"),
        ({"name": "command", "command": ["ls", 3]}, "command must be text or a list"),
        ({"name": "command", "env": {"A": ["x"]}}, "env must map"),
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
            {"name": "command", "command": ["pytest", "-q"], "timeout_s": 30, "env": {"A": "1"}},
        ]
    )
    assert [s["name"] for s in specs] == ["exact_number", "command"]


def test_invalid_specs_are_skipped_never_run() -> None:
    project = {"verifiers": [{"name": "command", "command": "make test"}, "pydoc:pipepager"]}
    # the project's valid spec stays, the one naming a module is dropped
    assert configured_verifiers(project, {}) == [{"name": "command", "command": "make test"}]
    meta = {"verifiers": ["os:system", {"name": "exact_number", "expected": 3}]}
    assert configured_verifiers({}, meta) == [{"name": "exact_number", "expected": 3}]
    # only the first MAX_SPECS of a long list
    many = {"verifiers": ["exact_number"] * (MAX_SPECS + 5)}
    assert len(configured_verifiers({}, many)) == MAX_SPECS
    # the gate's parameters come from the project's valid specs only
    assert project_params(project, "command") == {"command": "make test"}
    assert project_params(project, "pydoc:pipepager") == {}
