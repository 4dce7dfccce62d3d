"""When a project trains: the beat's threshold and schedule triggers.

Counting follows DAPO's dynamic sampling: members of a group (same ``group_id``) whose
rated rewards are all equal carry no gradient and do not count toward ``threshold`` or
``min_samples``; the trigger waits for groups that do. Interactions without a group
count one each. With guards on, a version must first be measured: no triggered run
before the serving version has ``guard_min_samples`` rated units (trainer/guards.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from schemas.atdp import RunStatus
from schemas.coltypes import utcnow
from schemas.tables import InteractionRow, ProjectRow, TrainingRunRow
from trainer import guards
from trainer.config import TrainConfig
from trainer.data import countable_where, fresh_versions

log = logging.getLogger("rlgate.trainer")


def count_signal(db: Session, project_id: str, max_staleness: int) -> int:
    """Trainable rows (rated, unconsumed, not aborted, fresh) that can carry a gradient:
    those without a group, and members of groups whose rewards differ."""
    names = fresh_versions(db, project_id, max_staleness)
    rows = db.execute(
        select(
            InteractionRow.group_id,
            func.count(),
            func.min(InteractionRow.reward),
            func.max(InteractionRow.reward),
        )
        .where(*countable_where(project_id), InteractionRow.policy_version.in_(names))
        .group_by(InteractionRow.group_id)
    ).all()
    total = 0
    for group_id, n, lo, hi in rows:
        if group_id is None or (n > 1 and hi - lo > 1e-6):
            total += int(n)
    return total


def due_trigger(db: Session, project: ProjectRow, cfg: TrainConfig) -> str | None:
    """'threshold' if >= threshold fresh samples that carry signal wait, 'schedule' if the
    schedule is due and >= min_samples of them wait, else None. With guards on, neither
    before the serving version has guard_min_samples rated units of its own traffic."""
    if project.training_paused:
        return None
    if cfg.guards and not guards.serving_measured(db, project.id, cfg):
        return None
    n = count_signal(db, project.id, cfg.max_staleness)
    if n >= max(cfg.threshold, 1):
        return "threshold"
    if n < max(cfg.min_samples, 1):
        return None
    last = db.scalar(
        select(func.max(TrainingRunRow.created_at)).where(
            TrainingRunRow.project_id == project.id,
            TrainingRunRow.status.in_(
                (RunStatus.running, RunStatus.published, RunStatus.trained_not_published)
            ),
        )
    )
    if last is None:
        return "schedule"
    now = utcnow()
    if last.tzinfo is None:
        last = last.replace(tzinfo=now.tzinfo)
    return "schedule" if now - last >= timedelta(minutes=cfg.schedule_minutes) else None


def due_projects(factory: sessionmaker[Session]) -> list[tuple[str, str]]:
    out = []
    with factory() as db:
        for project in db.scalars(select(ProjectRow)):
            try:
                cfg = TrainConfig.from_project_settings(project.settings)
            except ValueError as e:
                log.warning("project %s: %s", project.id, e)
                continue
            trigger = due_trigger(db, project, cfg)
            if trigger:
                out.append((project.id, trigger))
    return out
