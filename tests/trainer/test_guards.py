"""Guards and signal counting on recorded traffic (SQLite and PostgreSQL).

Interactions are written as the gateway records them (one row per sampled answer, groups
by ``group_id``); rewards are set directly, as credit assignment would. No engine: the
guards read only the database. The rollback itself (engine load, audit) is exercised on
real parts in test_guard_e2e.py.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from core.db import transaction
from schemas.coltypes import utcnow
from schemas.tables import InteractionRow, PolicyVersionRow, SessionRow
from tests.trainer.helpers import make_project
from trainer import guards
from trainer.config import TrainConfig
from trainer.data import select_samples
from trainer.triggers import count_signal

CFG = TrainConfig(guard_min_samples=4)


def _version(factory, pid: str, version: int, status: str) -> str:  # type: ignore[no-untyped-def]
    name = f"{pid}-policy-v{version}"
    with transaction(factory) as db:
        db.add(
            PolicyVersionRow(
                id=f"pv_{secrets.token_hex(6)}",
                project_id=pid,
                name=name,
                version=version,
                base_model="m",
                path=f"/nowhere/{name}",
                lora_config={},
                status=status,
                created_at=utcnow(),
            )
        )
    return name


def _group(
    factory: Any,
    pid: str,
    version: str,
    rewards: list[float | None],
    answers: list[list[int]] | None = None,
    logprob: float = -1.0,
) -> None:
    """One request with n = len(rewards) answers (a group when n > 1)."""
    sid = f"s_{secrets.token_hex(6)}"
    group = f"g_{secrets.token_hex(6)}" if len(rewards) > 1 else None
    answers = answers or [[100 + i, 7] for i in range(len(rewards))]
    with transaction(factory) as db:
        db.add(SessionRow(id=sid, project_id=pid, task_id="t"))
        db.flush()
        for i, (reward, ids) in enumerate(zip(rewards, answers, strict=True)):
            db.add(
                InteractionRow(
                    id=f"chatcmpl-{secrets.token_hex(8)}",
                    project_id=pid,
                    session_id=sid,
                    seq=i,
                    group_id=group,
                    choice_index=i,
                    request={},
                    prompt_token_ids=[1, 2, 3],
                    completion_token_ids=ids,
                    completion_logprobs=[logprob] * len(ids),
                    temperature=1.0,
                    top_p=1.0,
                    policy_version=version,
                    finish_reason="stop",
                    output={"text": "x"},
                    usage={},
                    created_at=utcnow(),
                    reward=reward,
                )
            )


def test_student_t_tail_matches_tables() -> None:
    # P(T > t) from standard t tables
    assert guards.student_t_sf(2.228, 10) == pytest.approx(0.025, abs=2e-4)
    assert guards.student_t_sf(1.0, 1) == pytest.approx(0.25, abs=1e-6)  # Cauchy
    assert guards.student_t_sf(0.0, 5) == pytest.approx(0.5)
    assert guards.student_t_sf(-2.228, 10) == pytest.approx(0.975, abs=2e-4)
    assert guards.student_t_sf(3.0, 1000) == pytest.approx(0.00138, abs=5e-5)  # ~normal


def test_welch_knows_how_many_samples_it_has() -> None:
    """The same gap in means is significant with many units and not with two."""
    good, bad = [0.6, 0.4, 0.5, 0.7, 0.3], [0.2, 0.4, 0.1, 0.3, 0.0]
    assert guards.welch_p(good * 4, bad * 4) < 0.001
    assert guards.welch_p(good[:2], bad[:2]) > 0.05
    assert guards.welch_p(bad * 4, good * 4) > 0.99  # one-sided


def test_reward_guard_trips_on_a_worse_version_not_on_a_similar_one(migrated_db) -> None:
    factory = migrated_db
    pid = make_project(factory, {})
    v1 = _version(factory, pid, 1, "retired")
    v2 = _version(factory, pid, 2, "serving")
    for r in ([1.0, 0.0], [1.0, 0.5], [0.5, 0.0], [1.0, 1.0], [0.0, 1.0]):
        _group(factory, pid, v1, r)
    for r in ([1.0, 0.0], [0.5, 0.5], [0.5, 1.0], [0.0, 1.0]):  # about as good: no trip
        _group(factory, pid, v2, r)
    with factory() as db:
        assert guards.check(db, pid, CFG) is None
    for r in ([0.0, -1.0], [-1.0, -1.0], [0.0, -0.5], [-1.0, -0.5]) * 2:  # much worse now
        _group(factory, pid, v2, r)
    with factory() as db:
        trip = guards.check(db, pid, CFG)
        assert guards.serving_measured(db, pid, CFG)
    assert trip is not None and trip.guard == "reward"
    assert trip.best.name == v1 and trip.serving.name == v2
    assert trip.p_value is not None and trip.p_value < CFG.guard_alpha
    details = trip.details()
    assert details["reason"] == "guard:reward" and details["rolled_back"] == v2
    assert details["serving_stats"]["units"] == 12 and details["best_stats"]["units"] == 5
    with factory() as db:  # too few units of the serving version: no judgement yet
        cfg = TrainConfig(guard_min_samples=20)
        assert guards.check(db, pid, cfg) is None
        assert not guards.serving_measured(db, pid, cfg)


def test_collapse_signs_trip_only_below_the_best_reward(migrated_db) -> None:
    """Every answer alike: a collapse when the reward dropped (before the t-test is
    sure), success when every answer is right."""
    factory = migrated_db
    pid = make_project(factory, {})
    v1 = _version(factory, pid, 1, "retired")
    v2 = _version(factory, pid, 2, "serving")
    for r in ([1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0, 0, 1]):
        _group(factory, pid, v1, r)
    same = [[230, 13]] * 4  # one constant answer, sampled with near-certainty
    for r in ([0.0] * 4, [0.0] * 4, [1.0] * 4, [0.0] * 4):
        _group(factory, pid, v2, r, answers=same, logprob=-0.001)
    cfg = TrainConfig(guard_min_samples=4, guard_alpha=1e-9)  # the t-test alone: no trip
    with factory() as db:
        trip = guards.check(db, pid, cfg)
        stats = guards.version_stats(db, pid, v2, 2)
    assert stats.zero_variance_share == 1.0 and stats.diversity == 0.25
    assert stats.entropy == pytest.approx(0.001)
    assert trip is not None and trip.guard == "zero_variance"
    with factory() as db:
        off = dict(guard_min_samples=4, guard_alpha=1e-9, guard_max_zero_variance=1.0)
        trip = guards.check(db, pid, TrainConfig(**off, guard_min_diversity=0.3))  # type: ignore[arg-type]
        assert trip is not None and trip.guard == "diversity"  # 1 distinct answer in 4
        trip = guards.check(db, pid, TrainConfig(**off))  # type: ignore[arg-type]
        assert trip is not None and trip.guard == "entropy"  # 0.001 nats per token

    pid2 = make_project(factory, {})  # the same collapse onto right answers: fine
    w1 = _version(factory, pid2, 1, "retired")
    w2 = _version(factory, pid2, 2, "serving")
    for r in ([1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0, 0, 1]):
        _group(factory, pid2, w1, r)
    for _ in range(4):
        _group(factory, pid2, w2, [1.0] * 4, answers=same, logprob=-0.001)
    with factory() as db:
        assert guards.check(db, pid2, cfg) is None


def test_zero_variance_is_judged_against_the_versions_own_success_rate(migrated_db) -> None:
    """Early on most groups of 8 are all wrong because the answers are rarely right, not
    because they are alike: at p = 1/32 independent answers give p^8 + (1-p)^8 = 0.78 of
    groups one reward. A share of 0.875 is within 0.2 of that (no trip); the same share at
    p = 3/16 (expected 0.19) is a collapse."""
    factory = migrated_db
    pid = make_project(factory, {})
    v1 = _version(factory, pid, 1, "retired")
    v2 = _version(factory, pid, 2, "serving")
    for _ in range(8):
        _group(factory, pid, v1, [1.0, 0.0] * 4)  # best: mean 0.5
    for _ in range(7):  # 7 groups all wrong, one with 2 right: p = 2/64
        _group(factory, pid, v2, [0.0] * 8)
    _group(factory, pid, v2, [1.0] * 2 + [0.0] * 6)
    cfg = TrainConfig(guard_min_samples=4, guard_alpha=1e-12, guard_min_entropy=0.0)
    with factory() as db:
        stats = guards.version_stats(db, pid, v2, 2)
        assert stats.zero_variance_share == pytest.approx(7 / 8)
        p = 2 / 64
        assert stats.expected_zero_variance == pytest.approx(p**8 + (1 - p) ** 8)
        assert guards.check(db, pid, cfg) is None

    pid2 = make_project(factory, {})
    w1 = _version(factory, pid2, 1, "retired")
    w2 = _version(factory, pid2, 2, "serving")
    for _ in range(8):
        _group(factory, pid2, w1, [1.0, 0.0] * 4)
    for _ in range(6):
        _group(factory, pid2, w2, [0.0] * 8)
    _group(factory, pid2, w2, [1.0] * 8)
    _group(factory, pid2, w2, [1.0] * 4 + [0.0] * 4)  # p = 12/64: expected 0.19
    with factory() as db:
        stats = guards.version_stats(db, pid2, w2, 2)
        assert stats.expected_zero_variance is not None and stats.expected_zero_variance < 0.3
        trip = guards.check(db, pid2, cfg)
    assert trip is not None and trip.guard == "zero_variance"
    assert guards.expected_zero_variance([[0.5, 0.2], [0.1, 0.1]]) is None  # not right/wrong


def test_zero_variance_groups_do_not_count_toward_the_threshold(migrated_db) -> None:
    factory = migrated_db
    pid = make_project(factory, {})
    _group(factory, pid, "base", [0.0, 0.0, 0.0])  # no signal
    _group(factory, pid, "base", [1.0, 0.0, None])  # signal (one answer not rated yet)
    _group(factory, pid, "base", [0.5])  # a singleton counts
    with factory() as db:
        assert count_signal(db, pid, 2) == 3


def test_samples_of_a_rolled_back_version_are_not_trained_on(migrated_db) -> None:
    factory = migrated_db
    pid = make_project(factory, {})
    v1 = _version(factory, pid, 1, "serving")
    v2 = _version(factory, pid, 2, "retired")  # served, then rolled back to v1
    _group(factory, pid, v1, [1.0, 0.0])
    _group(factory, pid, v2, [1.0, 0.0])
    with factory() as db:
        sel = select_samples(db, pid, max_staleness=2, max_samples=100, group_by_prompt=True)
        assert count_signal(db, pid, 2) == 2
    assert {s.version for s in sel.samples} == {1} and sel.skipped["rolled_back"] == 2


def test_zero_variance_groups_do_not_take_places_in_the_batch() -> None:
    """DAPO's dynamic sampling: a run of max_kept samples is filled with groups that carry
    signal; zero-variance groups are dropped (consumed) and do not count; the rest waits."""
    from trainer.advantages import Baselines, compute_advantages
    from trainer.data import Sample

    def group(g: str, rewards: list[float]) -> list[Sample]:
        return [Sample(f"{g}{i}", [1], [2], [-1.0], 1.0, r, g, "t") for i, r in enumerate(rewards)]

    samples = (
        group("a", [0.0, 0.0])  # no signal
        + group("b", [1.0, 0.0])
        + group("c", [1.0, 1.0])  # no signal
        + group("d", [0.0, 1.0])
        + group("e", [1.0, 0.0])  # over the cap: deferred to the next run
        + group("f", [0.0, 0.0])
    )
    kept, dropped, stats = compute_advantages(samples, Baselines(), max_kept=4)
    assert [s.group_key for s in kept] == ["b", "b", "d", "d"]
    assert {s.group_key for s in dropped} == {"a", "c"}
    assert stats.deferred_samples == 4 and stats.dropped_zero_variance_groups == 2
