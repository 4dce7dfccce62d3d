"""What a reward source is: one :class:`RewardSource` registration declares a verifier's
or a judge's parameters, the operator entry it names, its extra checks and its runner.

The registrations are collected in trainer/reward_registry.py (``REGISTRY``); every table
derives from them: the parameters a spec may carry and which are the operator's
(trainer/verifier_specs.py), which parameters session metadata may not set, which names
exist (trainer/verifiers.py), how the verifier task runs a spec (trainer/hooks.py), and
whether the eval gate can use it (trainer/eval_gate.py). Data never names code: a spec
names a registration, and a registration names the operator's entry only through
``grant`` (core/grants.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from core.grants import Grants
from schemas.atdp import FeedbackSource, Interaction
from schemas.atdp import Session as SessionRecord


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


# rates one final answer: a reward in [-1, 1], or None to abstain
Verifier = Callable[[VerifierContext, Interaction], float | None]
# rates a whole closed session (and its siblings): (factory, session, interactions, spec,
# store, deadline) -> the stored feedback as JSON; it stores through ``store``
SessionRater = Callable[..., list[dict[str, Any]]]
# rates one answer by the user's next message, when that message arrives (trainer/
# next_turn.py): (factory, session, pair, spec, store, deadline) -> the stored feedback
NextTurnRater = Callable[..., list[dict[str, Any]]]


def _always(spec: dict[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class NextTurn:
    """A source's part that reads the user's next message: its runner, and which of its
    specs use it (the judge only in ``mode: next_turn``)."""

    rate: NextTurnRater
    applies: Callable[[dict[str, Any]], bool] = _always


@dataclass(frozen=True)
class GrantRef:
    """The operator's entry a spec names: the parameter that names it (``use``), the
    section of the operator's configuration (``commands``) and the lookup that checks the
    name exists and is granted to the project (raises core.grants.GrantError)."""

    param: str
    section: str
    lookup: Callable[[Grants, Any, str | None, str], Any]
    entry: type[BaseModel]  # the entry's model: its fields are the operator's, never a spec's


@dataclass(frozen=True)
class RewardSource:
    name: str
    # parameters a spec may carry (None: any plain JSON, for an entry point's verifier)
    params: tuple[str, ...] | None
    score: Verifier | None = None  # rates one answer (the eval gate can use it)
    rate_session: SessionRater | None = None  # or rates whole sessions (the verifier task)
    next_turn: NextTurn | None = None  # or rates an answer by the user's next message
    grant: GrantRef | None = None  # the operator entry a spec must name
    trusted_only: tuple[str, ...] = ()  # parameters only project settings may give
    check: Callable[[dict[str, Any], str], None] | None = None  # more checks; raises ValueError
    feedback_source: FeedbackSource = FeedbackSource.verifier

    def reads_next_turn(self, spec: dict[str, Any]) -> bool:
        """Whether this spec of the source rates answers by the user's next message, as
        that message arrives (never when the session closes)."""
        return self.next_turn is not None and self.next_turn.applies(spec)

    @property
    def operator_only(self) -> tuple[str, ...]:
        """Parameters refused in any spec: the fields of the operator's entry it names."""
        if self.grant is None:
            return ()
        return tuple(f for f in self.grant.entry.model_fields if f != "projects")

    @property
    def session_forbidden(self) -> tuple[str, ...]:
        """Parameters dropped from a spec in session metadata (an agent key can write it)."""
        names = (self.grant.param,) if self.grant else ()
        return (*names, *self.trusted_only, *self.operator_only)


def answer_verifier(
    table: dict[str, RewardSource], name: str, params: tuple[str, ...], **kw: Any
) -> Callable[[Verifier], Verifier]:
    """Register the decorated function in ``table`` as the answer verifier ``name``."""

    def register(fn: Verifier) -> Verifier:
        if name in table:
            raise ValueError(f"reward source {name!r} is registered twice")
        table[name] = RewardSource(name, params, score=fn, **kw)
        return fn

    return register
