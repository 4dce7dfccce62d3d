"""The built-in answer verifiers, each registered where it is defined (one decorator:
its name, its parameters, and for ``command`` the operator entry it names).

A verifier is a function ``(ctx: VerifierContext, answer: Interaction) -> float | None``:
a reward in [-1, 1] for one final answer, or None to abstain. **A new built-in verifier**
is a function here with ``@answer_verifier(SOURCES, "<name>", (<parameters>,))``, and a
test; trainer/reward_registry.py collects :data:`SOURCES`, and every table (known names,
allowed parameters, the verifier task, the eval gate) derives from it. Parameters are
plain data: a verifier that runs a program or calls a service names an operator entry
(``grant``, core/grants.py), never the program, URL or key itself.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import subprocess

from core.grants import CommandGrant, GrantError, Grants
from schemas.atdp import Interaction
from trainer import time_budget
from trainer.reward_source import GrantRef, RewardSource, VerifierContext, answer_verifier

log = logging.getLogger("rlgate.verifiers")

SOURCES: dict[str, RewardSource] = {}  # filled by the decorators below


def _grants() -> Grants:
    from core.settings import get_settings

    return get_settings().grants


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


@answer_verifier(SOURCES, "exact_number", ("expected",))
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


@answer_verifier(SOURCES, "contains", ("expected",))
def contains(ctx: VerifierContext, answer: Interaction) -> float | None:
    """+1 when the expected text appears in the answer (case and surrounding whitespace
    ignored), else -1; abstains when there is no expected value."""
    expected = ctx.expected
    if expected is None or not str(expected).strip():
        return None
    return 1.0 if str(expected).strip().lower() in (answer.output.text or "").lower() else -1.0


@answer_verifier(
    SOURCES,
    "command",
    ("use", "expected"),
    grant=GrantRef("use", "commands", Grants.command, CommandGrant),
)
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
    left = time_budget.remaining()  # the eval gate's budget, when it runs in the gate
    by_budget = left is not None and left < grant.timeout_s
    try:
        rc = proc.wait(timeout=left if by_budget else grant.timeout_s)
    except BaseException as e:  # the timeout, or the verify task's own time limit
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        if by_budget:
            raise time_budget.OverBudget(
                "the command was still running when the time budget ran out"
            ) from None
        log.info("command verifier timed out after %.0fs for %s", grant.timeout_s, answer.id)
        return -1.0
    return 1.0 if rc == 0 else -1.0


MAX_REQUIRED_KEYS = 32


def _check_required_keys(spec: dict[str, object], where: str) -> None:
    keys = spec.get("require_keys")
    if keys is None:
        return
    ok = isinstance(keys, list) and len(keys) <= MAX_REQUIRED_KEYS
    if not ok or not all(isinstance(k, str) and 0 < len(k) <= 128 for k in keys):  # type: ignore[union-attr]
        raise ValueError(
            f"{where}.require_keys must be a list of at most {MAX_REQUIRED_KEYS} key names"
        )


@answer_verifier(SOURCES, "json_valid", ("require_keys",), check=_check_required_keys)
def json_valid(ctx: VerifierContext, answer: Interaction) -> float | None:
    """+1 when the answer (optionally inside one fenced code block) is valid JSON and, with
    ``require_keys``, an object holding each of those keys; else -1."""
    text = (answer.output.text or "").strip()
    if text.startswith("```") and text.endswith("```") and "\n" in text:
        text = text[text.index("\n") + 1 : -3].strip()
    try:
        value = json.loads(text)
    except ValueError:
        return -1.0
    keys = ctx.config.get("require_keys") or []
    if keys and not (isinstance(value, dict) and all(k in value for k in keys)):
        return -1.0
    return 1.0
