"""Checking verifier specs (project ``settings["verifiers"]``, session metadata): a
registered name, known and bounded parameters, and for ``command`` and ``judge`` an
operator entry by name (core/grants.py): no spec names a program, a URL or a key. Pure
functions: the caller passes the registered names (``trainer.verifiers.verifier_names()``)
and the operator's grants (``Settings.grants``)."""

from __future__ import annotations

import json
import re
from typing import Any

from core.grants import GrantError, Grants, JudgeGrant

MAX_SPECS = 8  # verifiers per session / project
MAX_PARAMS_CHARS = 16_000  # a spec's parameters as JSON
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class VerifierSpecError(ValueError):
    """A verifier spec that cannot run; the message says what to change."""


def check_verifier_name(name: Any, where: str = "verifier") -> str:
    """A verifier name as stored data: a short identifier, never ``module:function``;
    :class:`VerifierSpecError` otherwise (trainer/eval_gate.py turns it into its own
    GateConfigError)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise VerifierSpecError(
            f"{where} must be the name of a registered verifier (a built-in such as "
            f"'exact_number' or 'contains', or an 'rlgate.verifiers' entry point), not {name!r}"
        )
    return name


# parameters that name a program, an address, a credential or a cap: the operator's to set,
# in its [commands.<name>] / [judges.<name>] entries (core/grants.py), never in data
OPERATOR_ONLY = {
    "command": ("command", "cwd", "env", "inherit_env", "timeout_s"),
    "judge": (
        "model",
        "api_base",
        "api_key_env",
        "timeout_s",
        "retries",
        "calls_per_hour",
        "seconds_per_hour",
        "usd_per_hour",
    ),
}


# ---- the LLM judge (trainer/judge.py) ---------------------------------------------------

# verifiers that rate a whole session (or group of sessions) in the verifier task, not one
# answer at a time: registered by name, run by trainer/hooks.py, never by the eval gate
SESSION_VERIFIERS = ("judge",)

JUDGE_MODES = ("group", "session", "next_turn")
MAX_RUBRIC_CHARS = 8000
# number parameters: (lowest, highest, integer only, default)
JUDGE_NUMBERS: dict[str, tuple[float, float, bool, float | None]] = {
    "group_size": (2, 16, True, 4),
    "temperature": (0, 2, False, 0.0),
    "max_tokens": (16, 4096, True, 512),
}
# what a project admin sets: the operator's entry by name, and inert choices
JUDGE_PARAMS = ("judge", "mode", "rubric", *JUDGE_NUMBERS)


def _check_judge_params(spec: dict[str, Any], where: str) -> None:
    mode = spec.get("mode", "session")
    if mode not in JUDGE_MODES:
        raise VerifierSpecError(f"{where}.mode must be one of {list(JUDGE_MODES)}, not {mode!r}")
    rubric = spec.get("rubric")
    if rubric is not None and (
        not isinstance(rubric, str) or not 0 < len(rubric) <= MAX_RUBRIC_CHARS
    ):
        raise VerifierSpecError(
            f"{where}.rubric must be text of 1..{MAX_RUBRIC_CHARS} characters, "
            f"not {type(rubric).__name__}"
        )
    for name, (low, high, integer, _) in JUDGE_NUMBERS.items():
        value = spec.get(name)
        if value is None:
            continue
        kind = int if integer else int | float
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            what = "an integer" if integer else "a number"
            raise VerifierSpecError(f"{where}.{name} must be {what} in {low}..{high}")


def judge_settings(spec: dict[str, Any], grant: JudgeGrant) -> dict[str, Any]:
    """A checked judge spec with every default filled in, over the operator's entry
    (model, URL, key variable and caps come from the entry only)."""
    out: dict[str, Any] = {"mode": "session", "rubric": None}
    out.update({k: d for k, (_, _, _, d) in JUDGE_NUMBERS.items()})
    out.update({k: v for k, v in spec.items() if k in JUDGE_PARAMS and v is not None})
    out.update(grant.model_dump(exclude={"projects"}))
    return out


# parameters of the built-ins (entry-point verifiers take any JSON parameters, bounded)
BUILTIN_PARAMS = {
    "exact_number": ("expected",),
    "contains": ("expected",),
    "command": ("use", "expected"),
    "judge": JUDGE_PARAMS,
}


def check_spec(
    item: Any, where: str, known: set[str], grants: Grants, project_id: str | None = None
) -> dict[str, Any]:
    """One verifier spec (a name, or an object ``{"name": ..., <params>}``) as a dict;
    :class:`VerifierSpecError` says what is wrong: an unregistered name, an unknown or
    out-of-range parameter, a parameter that is the operator's, or an operator entry
    (``use``, ``judge``) that does not exist or is not granted to ``project_id``."""
    spec = {"name": item} if isinstance(item, str) else item
    if not isinstance(spec, dict):
        raise VerifierSpecError(f"{where} must be a verifier name or an object with 'name'")
    name = check_verifier_name(spec.get("name"), f"{where}.name")
    if name not in known:
        raise VerifierSpecError(
            f"{where}.name: no verifier {name!r} is registered (known: {sorted(known)})"
        )
    params = {k: v for k, v in spec.items() if k != "name"}
    operators = sorted(set(params) & set(OPERATOR_ONLY.get(name, ())))
    if operators:
        kind, field = ("commands", "use") if name == "command" else ("judges", "judge")
        raise VerifierSpecError(
            f"{where}: {operators} are the operator's to set: they belong in a "
            f"[{kind}.<name>] entry of the operator's configuration, which the project "
            f"names with '{field}' (docs/security.md)"
        )
    allowed = BUILTIN_PARAMS.get(name)
    if allowed is not None and set(params) - set(allowed):
        raise VerifierSpecError(
            f"{where}: unknown parameters {sorted(set(params) - set(allowed))} for "
            f"{name!r}; allowed: {list(allowed)}"
        )
    try:
        size = len(json.dumps(params, allow_nan=False))
    except (TypeError, ValueError):
        raise VerifierSpecError(f"{where}: parameters must be plain JSON values") from None
    if size > MAX_PARAMS_CHARS:
        raise VerifierSpecError(f"{where}: parameters exceed {MAX_PARAMS_CHARS} characters")
    try:
        if name == "command":
            grants.command(spec.get("use"), project_id, where)
        elif name == "judge":
            _check_judge_params(spec, where)
            grants.judge(spec.get("judge"), project_id, where)
    except GrantError as e:
        raise VerifierSpecError(str(e)) from None
    return dict(spec)


def check_specs(
    raw: Any, where: str, known: set[str], grants: Grants, project_id: str | None = None
) -> list[dict[str, Any]]:
    """Validate a whole ``verifiers`` setting (one spec or a list of at most
    :data:`MAX_SPECS`); raises :class:`VerifierSpecError` on the first bad one."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_SPECS:
        raise VerifierSpecError(f"{where}: at most {MAX_SPECS} verifiers, not {len(items)}")
    specs = [
        check_spec(
            item, f"{where}[{i}]" if isinstance(raw, list) else where, known, grants, project_id
        )
        for i, item in enumerate(items)
    ]
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise VerifierSpecError(f"{where}: each verifier at most once, not {twice} twice")
    return specs
