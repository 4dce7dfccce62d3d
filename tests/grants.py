"""Operator grants in tests: the worker's and the gateway's RLGATE_COMMANDS / RLGATE_JUDGES
(core/grants.py), set through monkeypatch so each test starts without any."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.settings import get_settings
from trainer.verifier_specs import OPERATOR_ONLY


def grant(
    monkeypatch: pytest.MonkeyPatch,
    *,
    commands: dict[str, Any] | None = None,
    judges: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Set the operator's entries for this process (and return them as environment
    variables, for the processes a test starts)."""
    env = {}
    if commands is not None:
        env["RLGATE_COMMANDS"] = json.dumps(commands)
    if judges is not None:
        env["RLGATE_JUDGES"] = json.dumps(judges)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    return env


def judge_spec(entry: str, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the operator's entry, the project's spec naming it) from one flat parameter set."""
    operator = {k: v for k, v in params.items() if k in OPERATOR_ONLY["judge"]}
    spec = {"name": "judge", "judge": entry}
    spec.update({k: v for k, v in params.items() if k not in OPERATOR_ONLY["judge"]})
    return operator, spec
