"""Guards on the serving version: is it worse than the versions before it, or collapsing?

Measured on the version's own recorded traffic (rated interactions whose
``policy_version`` is its name, newest ``MAX_ROWS``). The unit of the reward comparison
is a request: a group (same ``group_id``) contributes its mean reward, an interaction
without a group its reward, so the test does not count 8 answers to one question as 8
independent observations. Guards, in order:

- ``reward``: a one-sided Welch t-test says the serving version's mean reward is below the
  best of the ``guard_window`` versions before it (p < ``guard_alpha``), and by at least
  ``guard_reward_margin``. Both sides need ``guard_min_samples`` units.
- ``zero_variance`` / ``diversity`` / ``entropy`` (collapse signs): the share of groups
  whose answers all got one reward is above ``guard_max_zero_variance`` and, for right/wrong
  (two-valued) rewards, above what independent answers at the version's own success rate p
  would give (mean of p^n + (1-p)^n over its groups) by ``ZERO_VARIANCE_EXCESS`` -- at
  p = 0.03 most groups of 8 are all wrong without any collapse --, the mean share of
  distinct answers per group (distinct / n) is below ``guard_min_diversity``, or the mean
  negative logprob of sampled tokens (T > 0; an estimate of the token entropy) is below
  ``guard_min_entropy`` -- each only while the version's mean reward is below the best
  earlier one's by ``guard_reward_margin`` (a policy that answers every question right
  also answers alike).

A trip re-serves the best earlier version through the rollback path (audit
``adapter.rollback``, actor ``guard``, ``reason: guard:<name>`` and the figures) and logs a
WARNING; the next run warm-starts from the re-served version's adapter. Only adapter
versions can be rolled back to (not the base model).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.serving_version import BASE, serving_version
from schemas.atdp import PolicyStatus
from schemas.tables import InteractionRow, PolicyVersionRow
from trainer.config import TrainConfig

log = logging.getLogger("rlgate.trainer")
MAX_ROWS = 2000  # newest rated interactions looked at per version
ZERO = 1e-6
ZERO_VARIANCE_EXCESS = 0.2  # zero-variance share above the independent-answers expectation


@dataclass
class VersionStats:
    name: str
    version: int
    units: list[float] = field(default_factory=list)  # mean reward per request
    samples: int = 0
    groups: int = 0
    zero_variance_groups: int = 0
    expected_zero_variance: float | None = None  # if answers were independent (two-valued)
    diversity: float | None = None  # mean distinct answers / n over groups
    entropy: float | None = None  # mean -logprob per sampled token (T > 0)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.units) if self.units else 0.0

    @property
    def zero_variance_share(self) -> float | None:
        return self.zero_variance_groups / self.groups if self.groups else None

    def figures(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "units"}
        return {**out, "units": len(self.units), "mean_reward": self.mean}


@dataclass
class Trip:
    guard: str
    serving: VersionStats
    best: VersionStats
    p_value: float | None

    def details(self) -> dict[str, Any]:
        return {
            "reason": f"guard:{self.guard}",
            "rolled_back": self.serving.name,
            "serving_stats": self.serving.figures(),
            "best_stats": self.best.figures(),
            "p_value": self.p_value,
        }


def version_stats(db: Session, project_id: str, name: str, version: int) -> VersionStats:
    rows = db.execute(
        select(
            InteractionRow.group_id,
            InteractionRow.reward,
            InteractionRow.completion_token_ids,
            InteractionRow.completion_logprobs,
            InteractionRow.temperature,
        )
        .where(
            InteractionRow.project_id == project_id,
            InteractionRow.policy_version == name,
            InteractionRow.reward.is_not(None),
        )
        .order_by(InteractionRow.created_at.desc())
        .limit(MAX_ROWS)
    ).all()
    out = VersionStats(name, version, samples=len(rows))
    groups: dict[str, list[tuple[float, tuple[int, ...]]]] = {}
    neg_lp, tokens = 0.0, 0
    for group_id, reward, ids, lps, temperature in rows:
        answer = tuple(ids or ())
        if group_id is None:
            out.units.append(float(reward))
        else:
            groups.setdefault(group_id, []).append((float(reward), answer))
        if (temperature or 0.0) > 0 and lps:
            neg_lp -= sum(float(x) for x in lps)
            tokens += len(lps)
    diversities = []
    sized: list[list[float]] = []
    for members in groups.values():
        rewards = [r for r, _ in members]
        out.units.append(statistics.fmean(rewards))
        if len(members) < 2:
            continue
        out.groups += 1
        out.zero_variance_groups += max(rewards) - min(rewards) < ZERO
        diversities.append(len({a for _, a in members}) / len(members))
        sized.append(rewards)
    out.diversity = statistics.fmean(diversities) if diversities else None
    out.expected_zero_variance = expected_zero_variance(sized)
    out.entropy = neg_lp / tokens if tokens else None
    return out


def expected_zero_variance(groups: list[list[float]]) -> float | None:
    """The share of groups whose answers would all get one reward if each answer were
    right independently with the version's own rate p: mean of p^n + (1-p)^n. Only for
    two-valued (right/wrong) rewards; None otherwise (or without groups)."""
    values = sorted({round(r, 6) for g in groups for r in g})
    if not groups or len(values) > 2:
        return None
    if len(values) == 1:
        return 1.0
    hi = values[1]
    flat = [r for g in groups for r in g]
    p = sum(abs(r - hi) < ZERO for r in flat) / len(flat)
    return statistics.fmean(p ** len(g) + (1 - p) ** len(g) for g in groups)


def welch_p(better: list[float], worse: list[float]) -> float:
    """One-sided p-value of Welch's t-test for mean(worse) < mean(better)."""
    n1, n2 = len(better), len(worse)
    m1, m2 = statistics.fmean(better), statistics.fmean(worse)
    v1, v2 = statistics.variance(better) / n1, statistics.variance(worse) / n2
    if v1 + v2 < ZERO**2:
        return 0.0 if m1 - m2 > ZERO else 1.0
    t = (m1 - m2) / math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))
    return student_t_sf(t, df)


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return tail if t > 0 else 1.0 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (continued fraction, Numerical Recipes)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(ln_front + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
    f = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
            c = 1.0 + num / c
            c = c if abs(c) > 1e-300 else 1e-300
            f *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return front * f / a


def serving_measured(db: Session, project_id: str, cfg: TrainConfig) -> bool:
    """Has the serving version (or the base model) enough rated units to be judged?"""
    row = serving_version(db, project_id)
    name = row.name if row else BASE
    rated = (
        InteractionRow.project_id == project_id,
        InteractionRow.policy_version == name,
        InteractionRow.reward.is_not(None),
    )
    groups = db.scalar(
        select(func.count(func.distinct(InteractionRow.group_id))).where(
            *rated, InteractionRow.group_id.is_not(None)
        )
    )
    singles = db.scalar(
        select(func.count())
        .select_from(InteractionRow)
        .where(*rated, InteractionRow.group_id.is_(None))
    )
    return int(groups or 0) + int(singles or 0) >= cfg.guard_min_samples


def check(db: Session, project_id: str, cfg: TrainConfig) -> Trip | None:
    """The first guard that trips for the serving version, or None."""
    row = serving_version(db, project_id)
    if row is None:
        return None
    cur = version_stats(db, project_id, row.name, row.version)
    if len(cur.units) < cfg.guard_min_samples:
        return None
    earlier = db.execute(
        select(PolicyVersionRow.name, PolicyVersionRow.version).where(
            PolicyVersionRow.project_id == project_id,
            PolicyVersionRow.version < row.version,
            PolicyVersionRow.version >= row.version - cfg.guard_window,
            PolicyVersionRow.status.in_((PolicyStatus.retired, PolicyStatus.serving)),
        )
    ).all()
    measured = [version_stats(db, project_id, n, v) for n, v in earlier]
    measured = [s for s in measured if len(s.units) >= cfg.guard_min_samples]
    if not measured:
        return None
    best = max(measured, key=lambda s: (s.mean, s.version))
    if best.mean - cur.mean < cfg.guard_reward_margin:
        return None
    p = welch_p(best.units, cur.units)
    if p < cfg.guard_alpha:
        return Trip("reward", cur, best, p)
    share, expected = cur.zero_variance_share, cur.expected_zero_variance
    if (
        share is not None
        and share > cfg.guard_max_zero_variance
        and (expected is None or share > expected + ZERO_VARIANCE_EXCESS)
    ):
        return Trip("zero_variance", cur, best, p)
    if cur.diversity is not None and cur.diversity < cfg.guard_min_diversity:
        return Trip("diversity", cur, best, p)
    if cur.entropy is not None and cur.entropy < cfg.guard_min_entropy:
        return Trip("entropy", cur, best, p)
    return None


def enforce(factory: sessionmaker[Session], settings: Any, project_id: str) -> dict | None:
    """Check the guards and, on a trip, re-serve the best earlier version (audited).
    Returns the audit details of the rollback, or None."""
    from trainer.serving_switch import project_config, serve_version

    with factory() as db:
        _, cfg = project_config(db, project_id)
        if not cfg.guards:
            return None
        trip = check(db, project_id, cfg)
    if trip is None:
        return None
    details = trip.details()
    s, b = trip.serving, trip.best
    log.warning(
        "GUARD %s tripped for project %s: %s has mean reward %.3f over %d requests "
        "(zero-variance share %s, expected %s, diversity %s, entropy %s) vs %s %.3f over %d "
        "(p=%.3g); "
        "rolling back to %s, training continues from its weights",
        trip.guard,
        project_id,
        s.name,
        s.mean,
        len(s.units),
        _fmt(s.zero_variance_share),
        _fmt(s.expected_zero_variance),
        _fmt(s.diversity),
        _fmt(s.entropy),
        b.name,
        b.mean,
        len(b.units),
        trip.p_value if trip.p_value is not None else float("nan"),
        b.name,
    )
    result = serve_version(  # answers once switched; a gateway unloads the collapsed one
        project_id,
        b.version,
        actor="guard",
        settings=settings,
        factory=factory,
        details=details,
        unload=False,
    )
    return {**details, "serving": result["name"]}


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
