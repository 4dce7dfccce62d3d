"""Advantages (pure python) and the per-project run lock (SQLite and PostgreSQL)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from trainer.advantages import Baselines, compute_advantages
from trainer.data import Sample


def s(iid: str, reward: float, group: str, task: str = "t") -> Sample:
    return Sample(iid, [1, 2], [3], [-0.1], 1.0, reward, group, task)


def test_group_normalization_leave_one_out_and_zero_variance() -> None:
    samples = [s("a", 1.0, "g1"), s("b", 0.0, "g1"), s("c", 0.5, "g1"),
               s("d", 1.0, "g2"), s("e", 1.0, "g2")]  # fmt: skip
    kept, dropped, st = compute_advantages(samples, Baselines(), std_normalize=True)
    std = math.sqrt(((0.5) ** 2 + 0.5**2 + 0) / 2)
    assert [x.interaction_id for x in kept] == ["a", "b", "c"]
    assert [x.advantage for x in kept] == pytest.approx([0.5 / std, -0.5 / std, 0.0], rel=1e-5)
    assert [x.interaction_id for x in dropped] == ["d", "e"]
    assert (st.groups, st.dropped_zero_variance_groups, st.dropped_samples) == (1, 1, 2)
    samples = [s("a", 1.0, "g1"), s("b", 0.0, "g1"), s("c", 0.5, "g1")]
    kept, _, _ = compute_advantages(samples, Baselines(), std_normalize=False, leave_one_out=True)
    # r_i - mean(others): 1 - 0.25, 0 - 0.75, 0.5 - 0.5
    assert [x.advantage for x in kept] == pytest.approx([0.75, -0.75, 0.0])


def test_singletons_use_a_persisted_running_baseline_never_zero() -> None:
    b = Baselines()
    kept, _, st = compute_advantages([s("a", 0.6, "x", "task1")], b, baseline_alpha=0.5)
    assert kept[0].advantage == pytest.approx(0.6) and st.singletons == 1  # baseline 0
    assert b.values["task1"] == {"mean": 0.6, "count": 1}
    b2 = Baselines(dict(b.values))  # as reloaded from Project.settings
    kept, _, _ = compute_advantages(
        [s("b", 1.0, "y", "task1"), s("c", 0.0, "z", "task2")], b2, baseline_alpha=0.5
    )
    assert [x.advantage for x in kept] == pytest.approx([0.4, 0.0])
    assert b2.values["task1"]["mean"] == pytest.approx(0.8)  # 0.6 + 0.5 * (1.0 - 0.6)


def test_one_active_run_per_project_and_takeover(migrated_db) -> None:  # type: ignore[no-untyped-def]
    from core.db import transaction
    from schemas.coltypes import utcnow
    from schemas.tables import ProjectRow, TrainingRunRow
    from trainer import runs

    with transaction(migrated_db) as db:
        db.add(ProjectRow(id="p1", name="p1"))
    first, why = runs.claim(migrated_db, "p1", "manual", {}, stale_after_s=60)
    assert first and why == "claimed"
    second, why = runs.claim(migrated_db, "p1", "schedule", {}, stale_after_s=60)
    assert second is None and first in why
    assert runs.heartbeat(migrated_db, first)
    # a run whose worker died on this host is taken over at once
    with transaction(migrated_db) as db:
        run = db.get(TrainingRunRow, first)
        run.config = {**run.config, "worker": f"{runs.worker_id().split(':')[0]}:999999"}
    third, why = runs.claim(migrated_db, "p1", "manual", {}, stale_after_s=60)
    assert third and why == "claimed"
    with migrated_db() as db:
        assert db.get(TrainingRunRow, first).status == "failed"
    # a remote worker without heartbeat for stale_after_s is taken over too
    old = (utcnow() - timedelta(seconds=120)).isoformat()
    with transaction(migrated_db) as db:
        run = db.get(TrainingRunRow, third)
        run.config = {**run.config, "worker": "elsewhere:1", "heartbeat_at": old}
    fourth, _ = runs.claim(migrated_db, "p1", "manual", {}, stale_after_s=300)
    assert fourth is None  # 120 s < 300 s: still alive
    fourth, _ = runs.claim(migrated_db, "p1", "manual", {}, stale_after_s=60)
    assert fourth is not None
    # claiming a finished run again does nothing (idempotent task redelivery)
    runs.finish(migrated_db, fourth, "published")
    again, why = runs.claim(migrated_db, "p1", "manual", {}, 60, run_id=fourth)
    assert again is None and "published" in why
