"""Every built-in reward source, by name: the answer verifiers of
trainer/builtin_verifiers.py, the LLM judge (trainer/judge_run.py ``JUDGE``) and the
rules that read the user's next message (trainer/next_turn_rules.py ``NEXT_TURN_RULES``). Installed
``rlgate.verifiers`` entry points add answer verifiers by name (trainer/verifiers.py).
A new reward source is one registration (trainer/reward_source.py ``RewardSource``);
the tables of trainer/verifier_specs.py and trainer/verifiers.py derive from this one."""

from __future__ import annotations

from trainer.builtin_verifiers import SOURCES
from trainer.judge_run import JUDGE
from trainer.next_turn_rules import NEXT_TURN_RULES
from trainer.reward_source import RewardSource

REGISTRY: dict[str, RewardSource] = {
    **SOURCES,
    JUDGE.name: JUDGE,
    NEXT_TURN_RULES.name: NEXT_TURN_RULES,
}
BUILTIN_NAMES = frozenset(REGISTRY)


def rates_sessions(name: str) -> bool:
    """Whether the built-in ``name`` rates whole sessions or next messages (the judge,
    the next-turn rules), not one answer: the eval gate cannot use it."""
    source = REGISTRY.get(name)
    return source is not None and source.score is None
