"""Every built-in reward source, by name: the answer verifiers of
trainer/builtin_verifiers.py and the LLM judge (trainer/judge_run.py ``JUDGE``). Installed
``rlgate.verifiers`` entry points add answer verifiers by name (trainer/verifiers.py).
A new reward source is one registration (trainer/reward_source.py ``RewardSource``);
the tables of trainer/verifier_specs.py and trainer/verifiers.py derive from this one."""

from __future__ import annotations

from trainer.builtin_verifiers import SOURCES
from trainer.judge_run import JUDGE
from trainer.reward_source import RewardSource

REGISTRY: dict[str, RewardSource] = {**SOURCES, JUDGE.name: JUDGE}
BUILTIN_NAMES = frozenset(REGISTRY)


def rates_sessions(name: str) -> bool:
    """Whether the built-in ``name`` rates whole sessions (the judge), not one answer:
    the eval gate cannot use it."""
    source = REGISTRY.get(name)
    return source is not None and source.score is None
