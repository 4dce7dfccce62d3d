"""Which reward sources run for a session, looked up by name only.

Reward sources are registered once each (trainer/reward_registry.py: the built-in answer
verifiers of trainer/builtin_verifiers.py and the LLM judge) or installed as Python entry
points in the group ``rlgate.verifiers`` (an answer verifier, any plain-JSON parameters);
no setting or metadata names a module or
function to import. The answer verifiers also score the eval gate's held-out prompts
(trainer/eval_gate.py).

Which run for a session: the ones named in the session's metadata (``"verifier":
"exact_number"``, or ``"verifiers": [...]``, each a name or an object ``{"name": ...,
<params>}``), else the project's ``settings["verifiers"]``. Parameters from the project
override the session's; a registration's ``session_forbidden`` parameters (the operator
entry's name, e.g. ``command``'s ``use``, and all of the judge's) are dropped from session
metadata (an agent key can write it). Specs are checked (:func:`check_specs`, via
trainer/verifier_specs.py: a known name, known parameters with bounds, at most
:data:`MAX_SPECS`); an invalid spec is logged and skipped, never run.

When a session closes, trainer.hooks.on_session_closed enqueues the verifier task if a
verifier is configured; trainer.hooks.run_verifiers runs each spec's registration and
stores the scores as feedback.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any

from core.grants import Grants
from trainer import verifier_specs
from trainer.builtin_verifiers import (  # re-exported: the built-ins' old home
    command,
    contains,
    exact_number,
    last_number,
    run_command,
)
from trainer.reward_registry import BUILTIN_NAMES, REGISTRY
from trainer.reward_source import RewardSource, Verifier, VerifierContext
from trainer.verifier_specs import MAX_SPECS, VerifierSpecError, check_spec

__all__ = [
    "MAX_SPECS",
    "VerifierContext",
    "VerifierSpecError",
    "command",
    "contains",
    "exact_number",
    "last_number",
    "run_command",
]

log = logging.getLogger("rlgate.verifiers")

ENTRY_POINT_GROUP = "rlgate.verifiers"


def _grants() -> Grants:
    from core.settings import get_settings

    return get_settings().grants


def verifier_names() -> set[str]:
    """The registered names: the built-ins (trainer/reward_registry.py, ``judge`` too)
    and the ``rlgate.verifiers`` entry points (read from the installed packages'
    metadata; nothing is imported)."""
    return set(BUILTIN_NAMES) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_source(name: str) -> RewardSource | None:
    """The reward source registered as ``name`` (built-in first, then the entry point
    group, as an answer verifier); None for any other string. Only installed entry points
    are ever loaded."""
    if not isinstance(name, str):
        return None
    if name in REGISTRY:
        return REGISTRY[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return RewardSource(name, None, score=ep.load())
    return None


def get_verifier(name: str) -> Verifier | None:
    """The answer verifier registered as ``name``; None for any other string and for a
    source that rates whole sessions (``judge``)."""
    source = get_source(name)
    return source.score if source is not None else None


# ---- which verifiers run ---------------------------------------------------------------------


def check_specs(
    raw: Any, where: str = "verifiers", project_id: str | None = None
) -> list[dict[str, Any]]:
    """Validate a whole ``verifiers`` setting against the registered names and the
    operator's grants for ``project_id`` (see trainer/verifier_specs.py); raises
    :class:`VerifierSpecError` on the first bad spec."""
    return verifier_specs.check_specs(raw, where, verifier_names(), _grants(), project_id)


def _specs(
    raw: Any, where: str, project: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The valid specs of a setting (the first :data:`MAX_SPECS`); an invalid one is
    logged and left out, never run. With ``project`` (session metadata): trusted-only
    parameters are dropped and the project's parameters of that name override the
    session's before the check."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_SPECS:
        log.warning("%s: only the first %d of %d verifiers run", where, MAX_SPECS, len(items))
    items = items[:MAX_SPECS]
    if project is not None:
        items = [_from_session(i, project) for i in items]
    names = {
        i if isinstance(i, str) else i.get("name") if isinstance(i, dict) else None for i in items
    }
    # built-in names only: no need to read the installed packages' entry points
    known = set(BUILTIN_NAMES) if names <= BUILTIN_NAMES else verifier_names()
    out = []
    grants = _grants()
    for i, item in enumerate(items):
        try:
            out.append(check_spec(item, f"{where}[{i}]", known, grants))
        except VerifierSpecError as e:
            log.warning("verifier not run: %s", e)
    return out


def _from_session(item: Any, project: dict[str, dict[str, Any]]) -> Any:
    """A spec from session metadata without its trusted-only parameters, with the
    project's parameters of that verifier over it."""
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict):
        return item
    name = item.get("name")
    if not isinstance(name, str):
        return item  # check_spec says what is wrong with it
    source = REGISTRY.get(name)
    forbidden = source.session_forbidden if source else ()
    kept = {k: v for k, v in item.items() if k not in forbidden}
    return {**kept, **project.get(name, {})}


def configured_verifiers(
    project_settings: dict[str, Any], session_meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """The verifier specs for a session (each ``{"name": ..., <params>}``)."""
    project = {s["name"]: s for s in _specs(project_settings.get("verifiers"), "verifiers")}
    named: list[dict[str, Any]] = []
    for key in ("verifiers", "verifier"):
        named = _specs(session_meta.get(key), f"session metadata {key}", project)
        if named:
            break
    return named or list(project.values())


def project_specs(project_settings: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The project's valid verifier specs (``settings["verifiers"]``), in order."""
    return _specs((project_settings or {}).get("verifiers"), "verifiers")


def project_params(project_settings: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """The project's parameters for verifier ``name`` (``settings["verifiers"]``), if any."""
    specs = project_specs(project_settings)
    return next(
        ({k: v for k, v in s.items() if k != "name"} for s in specs if s["name"] == name), {}
    )
