"""Advantages: group-normalized (GRPO) for groups, a running baseline for singletons.

- A group (same ``group_id`` from an ``n > 1`` request, or the same prompt) of size >= 2:
  ``A_i = r_i - mean(r)`` (or ``r_i - mean of the others`` with leave-one-out), divided
  by the group's std when ``std_normalize``. Groups whose rewards are all equal carry no
  signal: they are dropped and counted.
- A singleton: ``A = r - b`` with ``b`` the running baseline of its project/task (EMA),
  persisted between runs. Never silently zero: the first sample of a task is compared
  with baseline 0 (the middle of the [-1, 1] reward scale).
- ``max_kept`` (DAPO's dynamic sampling): groups and singletons are taken oldest first
  until this many samples carry signal; zero-variance groups do not take places in the
  batch. What comes after is deferred (neither trained nor consumed, baselines untouched)
  for the next run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from trainer.data import Sample

ZERO_STD = 1e-6


@dataclass
class Baselines:
    """Per-task running mean of singleton rewards: {key: {"mean": m, "count": n}}."""

    values: dict[str, dict[str, float]] = field(default_factory=dict)

    def get(self, key: str) -> float:
        return float(self.values.get(key, {}).get("mean", 0.0))

    def update(self, key: str, rewards: list[float], alpha: float) -> None:
        entry = dict(self.values.get(key, {"mean": 0.0, "count": 0}))
        for r in rewards:
            if entry["count"] == 0:
                entry["mean"] = r  # the first observation replaces the prior 0
            else:
                entry["mean"] += alpha * (r - entry["mean"])
            entry["count"] += 1
        self.values[key] = entry


@dataclass
class AdvantageStats:
    groups: int = 0
    singletons: int = 0
    dropped_zero_variance_groups: int = 0
    dropped_samples: int = 0
    deferred_samples: int = 0


def compute_advantages(
    samples: list[Sample],
    baselines: Baselines,
    *,
    std_normalize: bool = True,
    leave_one_out: bool = False,
    baseline_alpha: float = 0.1,
    max_kept: int | None = None,
) -> tuple[list[Sample], list[Sample], AdvantageStats]:
    """Set ``advantage`` on each kept sample; returns (kept, dropped, stats).

    Baselines are read before and updated after (with this batch's singleton rewards),
    so the result does not depend on sample order within a run.
    """
    by_group: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_group[s.group_key].append(s)
    kept: list[Sample] = []
    dropped: list[Sample] = []
    stats = AdvantageStats()
    singles: dict[str, list[float]] = defaultdict(list)
    for members in by_group.values():
        if max_kept is not None and len(kept) >= max_kept:
            stats.deferred_samples += len(members)
            continue
        if len(members) == 1:
            s = members[0]
            s.advantage = s.reward - baselines.get(s.baseline_key)
            singles[s.baseline_key].append(s.reward)
            stats.singletons += 1
            kept.append(s)
            continue
        rewards = [s.reward for s in members]
        n = len(rewards)
        mean = sum(rewards) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))  # unbiased
        if std < ZERO_STD:
            stats.dropped_zero_variance_groups += 1
            stats.dropped_samples += n
            dropped.extend(members)
            continue
        stats.groups += 1
        for s in members:
            # leave-one-out: r_i - mean(others) = n / (n - 1) * (r_i - mean)
            adv = s.reward - mean
            if leave_one_out:
                adv *= n / (n - 1)
            if std_normalize:
                adv /= std + ZERO_STD
            s.advantage = adv
            kept.append(s)
    for key, rewards in singles.items():
        baselines.update(key, rewards, baseline_alpha)
    return kept, dropped, stats
