"""Verifiers: reward functions that rate a closed session (run by the Celery task in
trainer/tasks.py, whose body is trainer/hooks.py).

A verifier is a function ``(ctx: VerifierContext, answer: Interaction) -> float | None``:
a reward in [-1, 1] for one final answer, or None to abstain. Verifiers are found by
name only, in :data:`VERIFIERS` (built in: ``exact_number``, ``contains``, ``command``)
and in the Python entry point group ``rlgate.verifiers``; no setting or metadata names a
module or function to import. The same verifiers score the eval gate's held-out prompts
(trainer/eval_gate.py).

Which verifiers run for a session: the ones named in the session's metadata
(``"verifier": "exact_number"``, or ``"verifiers": [...]``, each a name or an object
``{"name": ..., <params>}``), else the project's ``settings["verifiers"]``. Parameters
from the project override the session's. The ``command`` verifier runs only a program of
the operator's configuration (``[commands.<name>]``, core/grants.py), which the project's
settings name with ``use``; session metadata cannot even choose which (an agent key can
write it). Specs are checked (:func:`check_specs`: a known
name, known parameters with bounds, at most :data:`MAX_SPECS`); an invalid spec is logged
and skipped, never run.

When a session closes, trainer.hooks.on_session_closed enqueues the verifier task if a
verifier is configured; trainer.hooks.run_verifiers scores the final turn and stores the
scores as feedback.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from core.grants import CommandGrant, GrantError, Grants
from schemas.atdp import Interaction
from schemas.atdp import Session as SessionRecord
from trainer import verifier_specs
from trainer.verifier_specs import (
    BUILTIN_PARAMS,
    MAX_SPECS,
    OPERATOR_ONLY,
    SESSION_VERIFIERS,
    VerifierSpecError,
    check_spec,
)

log = logging.getLogger("rlgate.verifiers")

ENTRY_POINT_GROUP = "rlgate.verifiers"
# parameters only the project settings may give (session metadata is writable with an
# agent key): which operator command runs, and everything about the judge
TRUSTED_ONLY = {
    "command": ("use", *OPERATOR_ONLY["command"]),
    "judge": (*BUILTIN_PARAMS["judge"], *OPERATOR_ONLY["judge"]),
}


def _grants() -> Grants:
    from core.settings import get_settings

    return get_settings().grants


@dataclass
class VerifierContext:
    session: SessionRecord
    interactions: list[Interaction]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def expected(self) -> Any:
        """The expected answer: verifier params, then session metadata (``expected``,
        or ``task.expected``)."""
        if self.config.get("expected") is not None:
            return self.config["expected"]
        meta = self.session.metadata or {}
        if meta.get("expected") is not None:
            return meta["expected"]
        task = meta.get("task")
        if isinstance(task, dict):
            return task.get("expected")
        return None


Verifier = Callable[[VerifierContext, Interaction], float | None]

# ---- built-in verifiers --------------------------------------------------------------------

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def last_number(text: str | None) -> float | None:
    if not text:
        return None
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def exact_number(ctx: VerifierContext, answer: Interaction) -> float | None:
    """+1 when the last number in the answer equals the expected number, else -1;
    abstains when the session names no expected value."""
    expected = ctx.expected
    if expected is None:
        return None
    want = float(expected) if isinstance(expected, int | float) else last_number(str(expected))
    if want is None:
        return None
    got = last_number(answer.output.text)
    if got is None:
        return -1.0
    return 1.0 if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9) else -1.0


def contains(ctx: VerifierContext, answer: Interaction) -> float | None:
    """+1 when the expected text appears in the answer (case and surrounding whitespace
    ignored), else -1; abstains when there is no expected value."""
    expected = ctx.expected
    if expected is None or not str(expected).strip():
        return None
    return 1.0 if str(expected).strip().lower() in (answer.output.text or "").lower() else -1.0


def command(ctx: VerifierContext, answer: Interaction) -> float | None:
    """Runs the operator's command entry named by ``use`` (core/grants.py: its program,
    ``cwd``, ``env``, ``timeout_s``; the project only names it); exit status 0 -> +1,
    else -1, also on timeout. It sees only the worker variables its entry inherits, its
    entry's ``env``, and the answer: RLGATE_ANSWER, RLGATE_EXPECTED, RLGATE_SESSION_ID,
    RLGATE_INTERACTION_ID, RLGATE_TASK_ID. Abstains when the entry is gone or not granted
    to the session's project."""
    try:
        grant = _grants().command(ctx.config.get("use"), ctx.session.project_id, "command")
    except GrantError as e:
        log.warning("command verifier not run for %s: %s", answer.id, e)
        return None
    return run_command(grant, ctx, answer)


def run_command(grant: CommandGrant, ctx: VerifierContext, answer: Interaction) -> float:
    env = {k: os.environ[k] for k in grant.inherit_env if k in os.environ}
    env.update(grant.env)
    env.update(
        {
            "RLGATE_ANSWER": answer.output.text or "",
            "RLGATE_EXPECTED": "" if ctx.expected is None else str(ctx.expected),
            "RLGATE_SESSION_ID": ctx.session.id,
            "RLGATE_INTERACTION_ID": answer.id,
            "RLGATE_TASK_ID": ctx.session.task_id or "",
        }
    )
    cmd = grant.command
    proc = subprocess.Popen(
        cmd,
        shell=isinstance(cmd, str),
        cwd=grant.cwd or None,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: a timeout kills all of it
    )
    try:
        rc = proc.wait(timeout=grant.timeout_s)
    except BaseException as e:  # the timeout, or the verify task's own time limit
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        log.info("command verifier timed out after %.0fs for %s", grant.timeout_s, answer.id)
        return -1.0
    return 1.0 if rc == 0 else -1.0


VERIFIERS: dict[str, Verifier] = {
    "exact_number": exact_number,
    "contains": contains,
    "command": command,
}


BUILTIN_NAMES = frozenset(VERIFIERS) | frozenset(SESSION_VERIFIERS)


def verifier_names() -> set[str]:
    """The registered names: the built-ins (``judge`` too, which trainer/hooks.py runs on
    the whole session) and the ``rlgate.verifiers`` entry points (read from the installed
    packages' metadata; nothing is imported)."""
    return set(BUILTIN_NAMES) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_verifier(name: str) -> Verifier | None:
    """The verifier registered as ``name`` (built-in first, then the entry point group);
    None for any other string and for the session verifiers (``judge``), which do not
    score one answer. Only installed entry points are ever loaded."""
    if not isinstance(name, str) or name in SESSION_VERIFIERS:
        return None
    if name in VERIFIERS:
        return VERIFIERS[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()  # type: ignore[no-any-return]
    return None


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
    kept = {k: v for k, v in item.items() if k not in TRUSTED_ONLY.get(name, ())}
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


def project_params(project_settings: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """The project's parameters for verifier ``name`` (``settings["verifiers"]``), if any."""
    specs = _specs((project_settings or {}).get("verifiers"), "verifiers")
    return next(
        ({k: v for k, v in s.items() if k != "name"} for s in specs if s["name"] == name), {}
    )
