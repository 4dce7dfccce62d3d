"""The LLM judge: a registered verifier (``"name": "judge"``) that rates sessions through
litellm, so any provider works (or the base model behind an rlgate gateway, with a key of
another project).

The operator grants judges in its configuration (``[judges.<name>]``, core/grants.py):
the model, the URL, the variable holding the key, and the caps each project gets (one
call's ``timeout_s``, ``retries``, ``calls_per_hour``, ``seconds_per_hour``,
``usd_per_hour``). A project's ``settings["verifiers"]`` names one and sets only inert
choices (declared below, :data:`JUDGE_PARAMS` and :func:`check_judge_params`; the
registration that ties them to the runner is trainer/judge_run.py ``JUDGE``; none come
from session metadata)::

    {"name": "judge", "judge": "mini", "mode": "group", "rubric": "...", "group_size": 4}

Modes (run by the verifier task when a session closes, trainer/hooks.py):

- ``group``: the sibling trajectories of one group in one call, scored relatively in
  [0, 1] (RULER-style): the choices of an ``n > 1`` final turn, else the closed sessions
  of the same task (``task_id``), ``group_size`` at a time once that many are closed.
- ``session``: the session's final answer (each choice of an ``n > 1`` one) against the
  rubric, in [0, 1].
- ``next_turn``: each user message that follows an answer is classified (satisfied,
  correction, complaint, new_topic) and rates that answer (trainer/judge_text.py).

Scores in [0, 1] are stored as ``scale="scalar"`` over [0, 1] (reward ``2 s - 1``);
next_turn ratings as rewards over [-1, 1]. Every feedback has ``source="judge"``,
``rater="judge:<mode>"``, the judge's ``rationale`` and ``judge_model``, and an
idempotency key ``judge:<mode>:<target>``: a target already judged is not sent again.

Every call (attempt) is a ``judge_calls`` row with its outcome: ``ok``, ``unparsable``,
``timeout``, ``error``; ``budget`` when the project's budget (calls and known cost in the
last hour: calls, judge wall time, known cost) or the verify task's time limit refused
it, ``refused`` when the key belongs to the judged project (its calls would be recorded as
that project's training data), its variable is unset, or the entry is no longer granted.
An unparsable answer, a timeout or an error is retried (``retries``), then the target is
skipped: no feedback, never a made-up score.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.feedback import FeedbackInput
from core.grants import JudgeGrant
from core.keys import hash_secret, new_id
from schemas.coltypes import utcnow
from schemas.tables import ApiKeyRow, FeedbackRow, JudgeCallRow

log = logging.getLogger("rlgate.judge")

MOCK_ENV = "RLGATE_JUDGE_MOCK_RESPONSE"  # tests: litellm's mock_response for every call
COUNTED = ("ok", "unparsable", "timeout", "error")  # outcomes that were real calls
MAX_ERROR_CHARS = 1000
BACKOFF_S = 1.0  # after a timeout or provider error: wait attempt x this before retrying

T = TypeVar("T")
Store = Callable[[FeedbackInput], dict[str, Any] | None]


# ---- the judge's parameters (its registration: trainer/judge_run.py JUDGE) -------------

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


def check_judge_params(spec: dict[str, Any], where: str) -> None:
    mode = spec.get("mode", "session")
    if mode not in JUDGE_MODES:
        raise ValueError(f"{where}.mode must be one of {list(JUDGE_MODES)}, not {mode!r}")
    rubric = spec.get("rubric")
    if rubric is not None and (
        not isinstance(rubric, str) or not 0 < len(rubric) <= MAX_RUBRIC_CHARS
    ):
        raise ValueError(
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
            raise ValueError(f"{where}.{name} must be {what} in {low}..{high}")


def judge_settings(spec: dict[str, Any], grant: JudgeGrant) -> dict[str, Any]:
    """A checked judge spec with every default filled in, over the operator's entry
    (model, URL, key variable and caps come from the entry only)."""
    out: dict[str, Any] = {"mode": "session", "rubric": None}
    out.update({k: d for k, (_, _, _, d) in JUDGE_NUMBERS.items()})
    out.update({k: v for k, v in spec.items() if k in JUDGE_PARAMS and v is not None})
    out.update(grant.model_dump(exclude={"projects"}))
    return out


# ---- the call ----------------------------------------------------------------------------


def _litellm() -> Any:
    """litellm, imported on first use (it is slow to import), with its packaged price
    list: no download from GitHub at import (LITELLM_LOCAL_MODEL_COST_MAP; an operator
    may set it to False)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


def _completion(**kwargs: Any) -> Any:
    """litellm.completion; with RLGATE_JUDGE_MOCK_RESPONSE set (tests), litellm's own
    mock_response."""
    litellm = _litellm()

    mock = os.environ.get(MOCK_ENV)
    if mock is not None:
        kwargs["mock_response"] = mock
    return litellm.completion(**kwargs)


def _cost(response: Any) -> float | None:
    """The call's cost in USD where litellm knows the model's price, else None."""
    try:
        cost = _litellm().completion_cost(completion_response=response)
    except Exception:
        return None
    return float(cost) if isinstance(cost, int | float) and cost > 0 else None


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, _litellm().Timeout | TimeoutError)


def usage(factory: sessionmaker[Session], project_id: str, hours: float = 1.0) -> dict[str, Any]:
    """Judge calls of the project in the last ``hours``: counted calls, their wall time
    (seconds), known cost (USD) and the count per outcome."""
    since = utcnow() - timedelta(hours=hours)
    with factory() as db:
        rows = db.execute(
            select(JudgeCallRow.outcome, func.count(), func.sum(JudgeCallRow.cost_usd))
            .where(JudgeCallRow.project_id == project_id, JudgeCallRow.created_at >= since)
            .group_by(JudgeCallRow.outcome)
        ).all()
        seconds = db.scalar(
            select(func.sum(JudgeCallRow.latency_ms)).where(
                JudgeCallRow.project_id == project_id, JudgeCallRow.created_at >= since
            )
        )
    outcomes = {str(o): int(n) for o, n, _ in rows}
    return {
        "calls": sum(n for o, n in outcomes.items() if o in COUNTED),
        "seconds": round(float(seconds or 0.0) / 1000, 3),
        "cost_usd": round(sum(float(c or 0.0) for _, _, c in rows), 6),
        "outcomes": outcomes,
    }


def _budget_left(factory: sessionmaker[Session], project_id: str, cfg: dict[str, Any]) -> bool:
    used = usage(factory, project_id)
    if used["calls"] >= cfg["calls_per_hour"] or used["seconds"] >= cfg["seconds_per_hour"]:
        return False
    limit = cfg.get("usd_per_hour")
    return limit is None or used["cost_usd"] < float(limit)


def _key_of_judged_project(
    factory: sessionmaker[Session], project_id: str, api_key: str | None
) -> bool:
    """Whether the judge would authenticate as the judged project (its calls, through an
    rlgate gateway, would be recorded as that project's training data), or with the
    bootstrap admin key (whose project is the gateway's default one)."""
    if not api_key:
        return False
    from core.settings import get_settings

    admin = get_settings().admin_key
    if admin is not None and api_key == admin.get_secret_value():
        return True
    with factory() as db:
        owner = db.scalar(
            select(ApiKeyRow.project_id).where(ApiKeyRow.key_hash == hash_secret(api_key))
        )
    return owner == project_id


class Caller:
    """Judge calls for one project and one session: budget, key check, retries, and a
    ``judge_calls`` row per attempt."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        project_id: str,
        session_id: str,
        cfg: dict[str, Any],
        deadline: float | None = None,
    ) -> None:
        self.factory, self.project_id, self.session_id, self.cfg = (
            factory,
            project_id,
            session_id,
            cfg,
        )
        # time.monotonic() past which no call starts (the verify task's time limit)
        self.deadline = deadline
        self.skipped = 0

    def _record(self, outcome: str, attempt: int, **extra: Any) -> None:
        err = extra.pop("error", None)
        with self.factory() as db, db.begin():
            db.add(
                JudgeCallRow(
                    id=new_id("jc"),
                    project_id=self.project_id,
                    session_id=self.session_id,
                    mode=self.cfg["mode"],
                    model=self.cfg["model"],
                    outcome=outcome,
                    attempt=attempt,
                    error=str(err)[:MAX_ERROR_CHARS] if err is not None else None,
                    created_at=utcnow(),
                    **extra,
                )
            )

    def _kwargs(self, messages: list[dict[str, str]]) -> dict[str, Any] | None:
        cfg = self.cfg
        kwargs: dict[str, Any] = {
            "model": cfg["model"],
            "messages": messages,
            "temperature": cfg["temperature"],
            "max_tokens": cfg["max_tokens"],
            "timeout": float(cfg["timeout_s"]),  # lowered to the deadline in ask()
            "num_retries": 0,  # retried here, each attempt counted
            "response_format": {"type": "json_object"},
            "drop_params": True,
        }
        key = None
        if cfg.get("api_key_env"):
            key = os.environ.get(cfg["api_key_env"])
            if not key:
                msg = f"{cfg['api_key_env']} is not set on the worker"
                self._record("refused", 1, error=msg)
                log.warning("judge not called for %s: %s", self.session_id, msg)
                return None
        if cfg.get("api_base"):  # the operator's URL, with the operator's key or none
            kwargs["api_base"] = cfg["api_base"]
            # never let litellm send a provider key from the environment to this URL
            kwargs["api_key"] = key or "no-key"
        elif key:
            kwargs["api_key"] = key
        if _key_of_judged_project(self.factory, self.project_id, key):
            self._record("refused", 1, error="the judge's key belongs to the judged project")
            log.warning(
                "judge not called for %s: its key (%s) belongs to project %s, whose "
                "training data the calls would become",
                self.session_id,
                cfg.get("api_key_env"),
                self.project_id,
            )
            return None
        return kwargs

    def ask(
        self, messages: list[dict[str, str]], parse: Callable[[str | None], T | None]
    ) -> T | None:
        """The parsed answer, or None after the retries (or when the budget or the key
        check refuses); every attempt is counted."""
        kwargs = self._kwargs(messages)
        if kwargs is None:
            self.skipped += 1
            return None
        for attempt in range(1, int(self.cfg["retries"]) + 2):
            if not _budget_left(self.factory, self.project_id, self.cfg):
                self._record("budget", attempt)
                log.warning(
                    "judge budget of project %s spent; %s skipped", self.project_id, self.session_id
                )
                break
            started = time.monotonic()
            if self.deadline is not None:
                left = self.deadline - started
                if left < 1.0:
                    self._record("budget", attempt, error="the verify task's time limit")
                    log.warning("judge for %s stopped at the task's time limit", self.session_id)
                    break
                kwargs["timeout"] = min(float(self.cfg["timeout_s"]), left)
            try:
                response = _completion(**kwargs)
            except Exception as e:  # provider errors of every kind: count, retry
                outcome = "timeout" if _is_timeout(e) else "error"
                ms = (time.monotonic() - started) * 1000
                self._record(outcome, attempt, latency_ms=ms, error=f"{type(e).__name__}: {e}")
                log.info("judge call %d for %s: %s (%s)", attempt, self.session_id, outcome, e)
                if attempt <= int(self.cfg["retries"]):
                    time.sleep(BACKOFF_S * attempt)
                continue
            ms = (time.monotonic() - started) * 1000
            text = _content(response)
            parsed = parse(text)
            outcome = "ok" if parsed is not None else "unparsable"
            err = None if parsed is not None else f"answer: {text!r}"
            self._record(outcome, attempt, latency_ms=ms, cost_usd=_cost(response), error=err)
            if parsed is not None:
                return parsed
            log.info("judge call %d for %s: unparsable answer %r", attempt, self.session_id, text)
        self.skipped += 1
        return None


def _content(response: Any) -> str | None:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    return content if isinstance(content, str) else None


# ---- helpers of trainer/judge_run.py ----------------------------------------------------


def judged(factory: sessionmaker[Session], project_id: str, keys: list[str]) -> set[str]:
    if not keys:
        return set()
    with factory() as db:
        return set(
            db.scalars(
                select(FeedbackRow.idempotency_key).where(
                    FeedbackRow.project_id == project_id, FeedbackRow.idempotency_key.in_(keys)
                )
            ).all()
        )


def settings_for(spec: dict[str, Any], project_id: str) -> dict[str, Any]:
    """The judge configuration of a project's spec over the operator's entry it names;
    :class:`core.grants.GrantError` when that entry is gone or not granted to it."""
    from core.settings import get_settings

    grant = get_settings().grants.judge(spec.get("judge"), project_id, "judge")
    return judge_settings({k: v for k, v in spec.items() if k != "name"}, grant)
