"""Checking verifier specs (project ``settings["verifiers"]``, session metadata): a
registered name and known, bounded parameters. Pure functions: the caller passes the
registered names (``trainer.verifiers.verifier_names()``)."""

from __future__ import annotations

import json
from typing import Any

from trainer.eval_gate import GateConfigError, check_verifier_name

MAX_SPECS = 8  # verifiers per session / project
MAX_PARAMS_CHARS = 16_000  # a spec's parameters as JSON


class VerifierSpecError(ValueError):
    """A verifier spec that cannot run; the message says what to change."""


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
    try:
        name = check_verifier_name(spec.get("name"), f"{where}.name")
    except GateConfigError as e:
        raise VerifierSpecError(str(e)) from None
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
