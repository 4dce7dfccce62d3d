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


# parameters of the built-ins (entry-point verifiers take any JSON parameters, bounded)
BUILTIN_PARAMS = {
    "exact_number": ("expected",),
    "contains": ("expected",),
    "command": ("command", "cwd", "timeout_s", "env", "expected"),
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
    return dict(spec)


def check_specs(raw: Any, where: str, known: set[str]) -> list[dict[str, Any]]:
    """Validate a whole ``verifiers`` setting (one spec or a list of at most
    :data:`MAX_SPECS`); raises :class:`VerifierSpecError` on the first bad one."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_SPECS:
        raise VerifierSpecError(f"{where}: at most {MAX_SPECS} verifiers, not {len(items)}")
    return [
        check_spec(item, f"{where}[{i}]" if isinstance(raw, list) else where, known)
        for i, item in enumerate(items)
    ]
