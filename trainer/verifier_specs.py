"""Checking verifier specs (project ``settings["verifiers"]``, session metadata): a
registered name and known, bounded parameters. Pure functions: the caller passes the
registered names (``trainer.verifiers.verifier_names()``)."""

from __future__ import annotations

import json
import re
from typing import Any

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


def _check_command_params(spec: dict[str, Any], where: str) -> None:
    cmd = spec.get("command")
    if cmd is not None:
        ok = (isinstance(cmd, str) and 0 < len(cmd) <= 4000) or (
            isinstance(cmd, list)
            and 0 < len(cmd) <= 64
            and all(isinstance(a, str) and len(a) <= 4000 for a in cmd)
        )
        if not ok:
            raise VerifierSpecError(f"{where}.command must be text or a list of 1..64 strings")
    cwd = spec.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or len(cwd) > 1000):
        raise VerifierSpecError(f"{where}.cwd must be a path (text)")
    timeout = spec.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 1 <= timeout <= 3600
    ):
        raise VerifierSpecError(f"{where}.timeout_s must be a number of seconds in 1..3600")
    env = spec.get("env")
    if env is not None and (
        not isinstance(env, dict)
        or len(env) > 64
        or not all(isinstance(k, str) and isinstance(v, str | int | float) for k, v in env.items())
    ):
        raise VerifierSpecError(f"{where}.env must map at most 64 names to text values")


# ---- the LLM judge (trainer/judge.py) ---------------------------------------------------

# verifiers that rate a whole session (or group of sessions) in the verifier task, not one
# answer at a time: registered by name, run by trainer/hooks.py, never by the eval gate
SESSION_VERIFIERS = ("judge",)

JUDGE_MODES = ("group", "session", "next_turn")
JUDGE_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:@+=-]{0,199}$")
JUDGE_KEY_ENV_RE = re.compile(r"^RLGATE_JUDGE_[A-Z0-9_]{1,64}$")
MAX_RUBRIC_CHARS = 8000
# number parameters: (lowest, highest, integer only, default)
JUDGE_NUMBERS: dict[str, tuple[float, float, bool, float | None]] = {
    "timeout_s": (1, 600, False, 60),
    "retries": (0, 5, True, 2),
    "calls_per_hour": (1, 100_000, True, 120),
    "usd_per_hour": (0, 10_000, False, None),
    "group_size": (2, 16, True, 4),
    "temperature": (0, 2, False, 0.0),
    "max_tokens": (16, 4096, True, 512),
}
JUDGE_PARAMS = ("model", "mode", "api_base", "api_key_env", "rubric", *JUDGE_NUMBERS)


def _check_judge_params(spec: dict[str, Any], where: str) -> None:
    model = spec.get("model")
    if model is None:
        raise VerifierSpecError(
            f"{where}.model is required: a litellm model string such as 'openai/gpt-4o-mini'"
        )
    if not isinstance(model, str) or not JUDGE_MODEL_RE.match(model):
        raise VerifierSpecError(
            f"{where}.model must be a litellm model string (1..200 characters: letters, "
            f"digits and _./:@+=-), not {model!r}"
        )
    mode = spec.get("mode", "session")
    if mode not in JUDGE_MODES:
        raise VerifierSpecError(f"{where}.mode must be one of {list(JUDGE_MODES)}, not {mode!r}")
    base = spec.get("api_base")
    if base is not None and (
        not isinstance(base, str)
        or not base.startswith(("http://", "https://"))
        or len(base) > 500
        or any(c.isspace() for c in base)
    ):
        raise VerifierSpecError(f"{where}.api_base must be an http(s) URL, not {base!r}")
    env = spec.get("api_key_env")
    if env is not None and (not isinstance(env, str) or not JUDGE_KEY_ENV_RE.match(env)):
        raise VerifierSpecError(
            f"{where}.api_key_env must name an environment variable RLGATE_JUDGE_<NAME> "
            f"(only those are read, so no other secret can be sent to api_base), not {env!r}"
        )
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


def judge_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """A checked judge spec with every default filled in."""
    out: dict[str, Any] = {"mode": "session", "api_base": None, "api_key_env": None}
    out["rubric"] = None
    out.update({k: d for k, (_, _, _, d) in JUDGE_NUMBERS.items()})
    out.update({k: v for k, v in spec.items() if v is not None})
    return out


# parameters of the built-ins (entry-point verifiers take any JSON parameters, bounded)
BUILTIN_PARAMS = {
    "exact_number": ("expected",),
    "contains": ("expected",),
    "command": ("command", "cwd", "timeout_s", "env", "expected"),
    "judge": JUDGE_PARAMS,
}


def check_spec(item: Any, where: str, known: set[str]) -> dict[str, Any]:
    """One verifier spec (a name, or an object ``{"name": ..., <params>}``) as a dict;
    :class:`VerifierSpecError` says what is wrong: an unregistered name, an unknown or
    out-of-range parameter."""
    spec = {"name": item} if isinstance(item, str) else item
    if not isinstance(spec, dict):
        raise VerifierSpecError(f"{where} must be a verifier name or an object with 'name'")
    name = check_verifier_name(spec.get("name"), f"{where}.name")
    if name not in known:
        raise VerifierSpecError(
            f"{where}.name: no verifier {name!r} is registered (known: {sorted(known)})"
        )
    params = {k: v for k, v in spec.items() if k != "name"}
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
    if name == "command":
        _check_command_params(spec, where)
    elif name == "judge":
        _check_judge_params(spec, where)
    return dict(spec)


def check_specs(raw: Any, where: str, known: set[str]) -> list[dict[str, Any]]:
    """Validate a whole ``verifiers`` setting (one spec or a list of at most
    :data:`MAX_SPECS`); raises :class:`VerifierSpecError` on the first bad one."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_SPECS:
        raise VerifierSpecError(f"{where}: at most {MAX_SPECS} verifiers, not {len(items)}")
    specs = [
        check_spec(item, f"{where}[{i}]" if isinstance(raw, list) else where, known)
        for i, item in enumerate(items)
    ]
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise VerifierSpecError(f"{where}: each verifier at most once, not {twice} twice")
    return specs
