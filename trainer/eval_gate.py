"""The eval gate's settings (``training.eval_gate``) and how it scores one greedy output.

The settings are a strict schema (unknown keys and out-of-range values are errors that
say what to fix)::

    {"enabled": true,                 # default false: every candidate is promoted
     "verifier": "exact_number",      # a registered verifier name (default "contains")
     "prompts": [{"prompt": "What is 2+2?", "expected": 4},
                 {"input_ids": [1, 2, 3], "expected": "blue", "task_id": "colors"}],
     "max_new_tokens": 32,            # 1..MAX_NEW_TOKENS
     "margin": 0.0}                   # 0..MAX_MARGIN

The verifier is looked up by name only (``trainer.verifiers.get_verifier``: the built-ins
or an ``rlgate.verifiers`` entry point); no setting names a module or function to import.
Each prompt's output is scored like a session's final answer: the verifier gets a
:class:`~trainer.verifiers.VerifierContext` whose session metadata holds the prompt's
``expected`` (and ``task_id``) and the output as an ATDP ``Interaction``. A verifier
that raises, returns a non-number, or abstains on every prompt is a :class:`GateError`:
the gate then fails closed (trainer/publish.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core import engine_protocol as proto
from core.serving_version import BASE
from trainer import verifier_specs
from trainer.reward_registry import rates_sessions
from trainer.verifier_specs import VerifierSpecError

DEFAULT_VERIFIER = "contains"
MAX_PROMPTS = 64
MAX_PROMPT_CHARS = 8000
MAX_INPUT_IDS = 4096
MAX_TOKEN_ID = 2**31 - 1
MAX_EXPECTED_CHARS = 1000
MAX_TASK_ID_CHARS = 128
MAX_NEW_TOKENS = 256
MAX_MARGIN = 2.0  # verifier scores are in [-1, 1]
GATE_KEYS = ("enabled", "verifier", "prompts", "max_new_tokens", "margin")
PROMPT_KEYS = ("prompt", "input_ids", "expected", "task_id")


class GateConfigError(ValueError):
    """An ``eval_gate`` setting that is not allowed; the message says what to change."""


class GateError(Exception):
    """The gate could not score the candidate (verifier missing, raising, abstaining, or
    the engine refusing a prompt): the candidate is not promoted."""


def check_verifier_name(name: Any, where: str = "verifier") -> str:
    """A verifier name as stored data: a short identifier, never ``module:function``
    (trainer.verifier_specs.check_verifier_name, as a :class:`GateConfigError`)."""
    try:
        return verifier_specs.check_verifier_name(name, where)
    except VerifierSpecError as e:
        raise GateConfigError(str(e)) from None


@dataclass(frozen=True)
class GatePrompt:
    prompt: str | None = None
    input_ids: tuple[int, ...] | None = None
    expected: str | int | float | None = None
    task_id: str | None = None


def _prompt(i: int, raw: Any) -> GatePrompt:
    where = f"eval_gate.prompts[{i}]"
    if not isinstance(raw, dict):
        raise GateConfigError(f"{where} must be an object with 'prompt' or 'input_ids'")
    unknown = sorted(set(raw) - set(PROMPT_KEYS))
    if unknown:
        raise GateConfigError(f"{where}: unknown keys {unknown}; allowed: {list(PROMPT_KEYS)}")
    prompt, ids = raw.get("prompt"), raw.get("input_ids")
    if (prompt is None) == (ids is None):
        raise GateConfigError(f"{where} needs exactly one of 'prompt' (text) or 'input_ids'")
    if prompt is not None and (
        not isinstance(prompt, str) or not 0 < len(prompt) <= MAX_PROMPT_CHARS
    ):
        raise GateConfigError(f"{where}.prompt must be text of 1..{MAX_PROMPT_CHARS} characters")
    if ids is not None:
        ok = isinstance(ids, list) and 0 < len(ids) <= MAX_INPUT_IDS
        ok = ok and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in ids
        )
        if not ok:
            raise GateConfigError(
                f"{where}.input_ids must be a list of 1..{MAX_INPUT_IDS} token ids (integers >= 0)"
            )
    expected = raw.get("expected")
    if expected is not None:
        if isinstance(expected, bool) or not isinstance(expected, str | int | float):
            raise GateConfigError(f"{where}.expected must be text or a number")
        if isinstance(expected, float) and not math.isfinite(expected):
            raise GateConfigError(f"{where}.expected must be a finite number")
        if isinstance(expected, str) and len(expected) > MAX_EXPECTED_CHARS:
            raise GateConfigError(f"{where}.expected is longer than {MAX_EXPECTED_CHARS} chars")
    task_id = raw.get("task_id")
    if task_id is not None and (
        not isinstance(task_id, str) or not 0 < len(task_id) <= MAX_TASK_ID_CHARS
    ):
        raise GateConfigError(f"{where}.task_id must be text of 1..{MAX_TASK_ID_CHARS} chars")
    return GatePrompt(prompt, tuple(ids) if ids is not None else None, expected, task_id)


@dataclass(frozen=True)
class EvalGate:
    enabled: bool = False
    verifier: str = DEFAULT_VERIFIER
    prompts: tuple[GatePrompt, ...] = ()
    max_new_tokens: int = 32
    margin: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> EvalGate:
        """The validated gate settings; :class:`GateConfigError` says what is wrong."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise GateConfigError("eval_gate must be an object (see docs/trainer.md)")
        unknown = sorted(set(raw) - set(GATE_KEYS))
        if unknown:
            raise GateConfigError(f"eval_gate: unknown keys {unknown}; allowed: {list(GATE_KEYS)}")
        enabled = raw.get("enabled", False)
        if not isinstance(enabled, bool):
            raise GateConfigError("eval_gate.enabled must be true or false")
        verifier = check_verifier_name(raw.get("verifier", DEFAULT_VERIFIER), "eval_gate.verifier")
        if rates_sessions(verifier):
            raise GateConfigError(
                f"eval_gate.verifier: {verifier!r} rates whole sessions or the user's next "
                "message, not one answer; "
                "name a verifier that scores an answer (e.g. 'contains')"
            )
        prompts = raw.get("prompts", [])
        if not isinstance(prompts, list) or len(prompts) > MAX_PROMPTS:
            raise GateConfigError(f"eval_gate.prompts must be a list of at most {MAX_PROMPTS}")
        if enabled and not prompts:
            raise GateConfigError("eval_gate.prompts must not be empty when the gate is enabled")
        items = tuple(_prompt(i, p) for i, p in enumerate(prompts))
        tokens = raw.get("max_new_tokens", 32)
        if (
            isinstance(tokens, bool)
            or not isinstance(tokens, int)
            or not 1 <= tokens <= MAX_NEW_TOKENS
        ):
            raise GateConfigError(
                f"eval_gate.max_new_tokens must be an integer in 1..{MAX_NEW_TOKENS}"
            )
        margin = raw.get("margin", 0.0)
        if (
            isinstance(margin, bool)
            or not isinstance(margin, int | float)
            or not 0 <= margin <= MAX_MARGIN
        ):
            raise GateConfigError(f"eval_gate.margin must be a number in 0..{MAX_MARGIN}")
        return cls(enabled, verifier, items, tokens, float(margin))


def require_registered(raw: Any) -> None:
    """For settings about to be stored: the gate's verifier must be registered now (the
    run checks again and fails closed if it is gone by then)."""
    from trainer.verifiers import verifier_names

    gate = EvalGate.parse(raw)
    if raw and gate.verifier not in (known := verifier_names()):
        raise GateConfigError(
            f"eval_gate.verifier: no verifier {gate.verifier!r} is registered "
            f"(known: {sorted(known)})"
        )


# ---- scoring one output --------------------------------------------------------------


def resolve(name: str) -> Any:
    """The registered verifier called ``name``; :class:`GateError` if there is none."""
    from trainer.verifiers import get_verifier, verifier_names

    fn = get_verifier(name)
    if fn is None:
        raise GateError(
            f"verifier {name!r} is not registered (known: {sorted(verifier_names())}); "
            "fix training.eval_gate.verifier or install the plugin"
        )
    return fn


def score_output(
    verify: Any,
    name: str,
    params: dict[str, Any],
    index: int,
    item: GatePrompt,
    adapter: str | None,
    generated: dict[str, Any],
    project_id: str = "eval-gate",
) -> float | None:
    """Run the verifier on one ``/generate`` answer; the score in [-1, 1], None when it
    abstains. Any failure is a :class:`GateError` naming the verifier and the prompt."""
    from schemas.atdp import Interaction, ParsedOutput, SessionStatus, Usage
    from schemas.atdp import Session as SessionRecord
    from schemas.coltypes import utcnow
    from trainer.verifiers import VerifierContext

    now = utcnow()
    try:
        got = proto.read_output(generated, strict=False)
    except proto.BadAnswer as e:
        raise GateError(f"eval prompt {index}: {e}") from e
    sid = f"eval-gate-{index}"
    metadata: dict[str, Any] = {} if item.expected is None else {"expected": item.expected}
    session = SessionRecord(
        id=sid,
        project_id=project_id,  # whose operator grants apply (a command entry's projects)
        task_id=item.task_id,
        status=SessionStatus.closed,
        created_at=now,
        last_activity_at=now,
        metadata=metadata,
    )
    answer = Interaction(
        id=f"{sid}-{adapter or 'base'}",
        project_id=project_id,
        session_id=sid,
        seq=0,
        request={"eval_gate_prompt": index},
        prompt_token_ids=list(item.input_ids or []),
        completion_token_ids=got.ids,
        completion_logprobs=got.logprobs,
        temperature=0.0,
        top_p=1.0,
        policy_version=adapter or BASE,
        finish_reason=str(got.finish_reason or "stop"),
        output=ParsedOutput(text=got.text),
        usage=Usage(prompt_tokens=got.prompt_tokens or 0, completion_tokens=len(got.ids)),
        created_at=now,
    )
    ctx = VerifierContext(session, [answer], dict(params))
    try:
        score = verify(ctx, answer)
    except Exception as e:
        raise GateError(
            f"verifier {name!r} raised {type(e).__name__}: {e} on eval prompt {index}"
        ) from e
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise GateError(
            f"verifier {name!r} returned {score!r} on eval prompt {index}, not a number"
        )
    return max(-1.0, min(1.0, float(score)))
