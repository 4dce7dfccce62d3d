"""Checking verifier specs (project ``settings["verifiers"]``, session metadata): a
registered name, known and bounded parameters, and for a source with a ``grant``
(``command``, ``judge``) an operator entry by name (core/grants.py): no spec names a
program, a URL or a key. What each name allows comes from its registration
(trainer/reward_registry.py); nothing here names a verifier. Pure functions: the caller
passes the registered names (``trainer.verifiers.verifier_names()``) and the operator's
grants (``Settings.grants``)."""

from __future__ import annotations

import json
import re
from typing import Any

from core.grants import GrantError, Grants
from trainer.reward_registry import REGISTRY

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


# Every table derives from the registrations (trainer/reward_registry.py): a spec's allowed
# parameters, the operator's (its entry's fields, core/grants.py: a program, an address, a
# credential or a cap, never in data), and the extra checks.
OPERATOR_ONLY = {n: s.operator_only for n, s in REGISTRY.items() if s.operator_only}
BUILTIN_PARAMS = {n: s.params for n, s in REGISTRY.items() if s.params is not None}


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
    source = REGISTRY.get(name)  # None: an entry point's verifier (any plain JSON)
    operators = sorted(set(params) & set(source.operator_only)) if source else []
    if source and source.grant and operators:
        raise VerifierSpecError(
            f"{where}: {operators} are the operator's to set: they belong in a "
            f"[{source.grant.section}.<name>] entry of the operator's configuration, which "
            f"the project names with '{source.grant.param}' (docs/security.md)"
        )
    allowed = source.params if source else None
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
        if source and source.check:
            source.check(spec, where)
        if source and source.grant:
            source.grant.lookup(grants, spec.get(source.grant.param), project_id, where)
    except (GrantError, ValueError) as e:
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
