"""Retention: delete the raw payloads of old interactions.

Off by default. The days come from ``Project.settings["retention_days"]`` (an integer >= 1),
else the deployment setting ``retention_days`` (``RLGATE_RETENTION_DAYS``); ``rlgate
retention --days N`` applies N to every project it touches. For each interaction created
before ``now - days`` the job:

- replaces ``request`` with only the marker ``{"rlgate_redaction": {"redacted": true,
  "purged_at": ..., "retention_days": N, "reason": "retention"}}``;
- sets ``output`` to ``{}`` and empties ``prompt_token_ids``, ``completion_token_ids`` and
  ``completion_logprobs`` (the ids decode back to the same text);
- keeps what ATDP requires and what carries no content: ids, session, sequence, timing,
  sampling parameters, usage counts, reward, policy version.

Items of the project's conversations (the OpenAI Conversations API's
``conversation_items``, a copy of what turns sent and answered, not training data) added
before the cutoff are deleted, counted in ``conversation_items``.

It works in batches of ``batch_size`` rows (one transaction each), walks the old rows
once in (created_at, id) order, skips rows already purged (so a second run changes
nothing) and writes one AuditEvent ``retention.purge`` per project per run with the
counts. A marked row is never trained on (``trainer/data.py``).

The Celery beat job ``rlgate.retention`` runs it daily with at most
``MAX_ROWS_PER_RUN`` rows per run; the next run continues where it stopped.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import LargeBinary, delete, func, select, tuple_, type_coerce, update
from sqlalchemy.orm import Session, sessionmaker

from schemas.coltypes import utcnow
from schemas.tables import (
    AuditEventRow,
    ConversationItemRow,
    ConversationRow,
    InteractionRow,
    ProjectRow,
)
from trainer.data import REDACTION_MARKER

log = logging.getLogger("rlgate.retention")

TASK_NAME = "rlgate.retention"
EVERY_S = 24 * 3600.0
BATCH_SIZE = 500
MAX_ROWS_PER_RUN = 50_000
SETTING = "retention_days"
EMPTY = type_coerce(b"", LargeBinary)


class RetentionConfigError(ValueError):
    """A retention setting that cannot be used; the message says which and why."""


@dataclass
class ProjectPurge:
    """What one run did (or, dry, would do) to one project."""

    project_id: str
    days: int
    cutoff: datetime
    purged: int = 0
    dry_run: bool = False
    complete: bool = True  # False: stopped at max_rows, the next run continues
    conversation_items: int = 0  # conversation items deleted (or, dry, to delete)


def check_days(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RetentionConfigError(f"{where} must be a whole number of days >= 1, not {value!r}")
    return value


def project_days(settings: dict[str, Any] | None, default_days: int | None) -> int | None:
    """The project's own ``retention_days`` if set, else the deployment's."""
    own = (settings or {}).get(SETTING)
    if own is not None:
        return check_days(own, f"Project.settings[{SETTING!r}]")
    return check_days(default_days, SETTING)


def _not_purged():  # type: ignore[no-untyped-def]
    return InteractionRow.request[(REDACTION_MARKER, "purged_at")].as_string().is_(None)


def _old(project_id: str, cutoff: datetime):  # type: ignore[no-untyped-def]
    return (
        InteractionRow.project_id == project_id,
        InteractionRow.created_at < cutoff,
        _not_purged(),
    )


def _audit(db: Session, actor: str, result: ProjectPurge) -> None:
    details = asdict(result)
    details["cutoff"] = result.cutoff.isoformat()
    details.pop("project_id")
    db.add(
        AuditEventRow(
            id=f"evt_{secrets.token_hex(12)}",
            project_id=result.project_id,
            actor=actor,
            action="retention.purge",
            target_type="interaction",
            target_id=None,
            details=details,
            created_at=utcnow(),
        )
    )


def purge_project(
    factory: sessionmaker[Session],
    project_id: str,
    days: int,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    max_rows: int | None = None,
    actor: str = "system",
) -> ProjectPurge:
    cutoff = (now or utcnow()) - timedelta(days=days)
    result = ProjectPurge(project_id, days, cutoff, dry_run=dry_run)
    if dry_run:
        with factory() as db:
            n = db.scalar(
                select(func.count()).select_from(InteractionRow).where(*_old(project_id, cutoff))
            )
            result.purged = int(n or 0)
    else:
        stub = {
            REDACTION_MARKER: {
                "redacted": True,
                "reason": "retention",
                "purged_at": utcnow().isoformat(),
                "retention_days": days,
            }
        }
        last: tuple[datetime, str] | None = None
        while True:
            limit = batch_size
            if max_rows is not None:
                limit = min(limit, max_rows - result.purged)
                if limit <= 0:
                    result.complete = False
                    break
            with factory() as db, db.begin():
                q = select(InteractionRow.created_at, InteractionRow.id).where(
                    *_old(project_id, cutoff)
                )
                if last is not None:
                    q = q.where(tuple_(InteractionRow.created_at, InteractionRow.id) > last)
                rows = db.execute(
                    q.order_by(InteractionRow.created_at, InteractionRow.id).limit(limit)
                ).all()
                if not rows:
                    break
                last = (rows[-1][0], rows[-1][1])
                done = db.execute(
                    update(InteractionRow)
                    .where(InteractionRow.id.in_([r[1] for r in rows]), _not_purged())
                    .values(
                        request=stub,
                        output={},
                        # an empty packed array is zero bytes (schemas/coltypes.py)
                        prompt_token_ids=EMPTY,
                        completion_token_ids=EMPTY,
                        completion_logprobs=EMPTY,
                    )
                    .execution_options(synchronize_session=False)
                )
                result.purged += int(done.rowcount or 0)
            if len(rows) < limit:
                break
    with factory() as db, db.begin():
        result.conversation_items = _conversation_items(db, project_id, cutoff, dry_run)
        _audit(db, actor, result)
    return result


def _conversation_items(db: Session, project_id: str, cutoff: datetime, dry_run: bool) -> int:
    """Deletes (or, dry, counts) the project's conversation items older than ``cutoff``."""
    where = (
        ConversationItemRow.conversation_id.in_(
            select(ConversationRow.id).where(ConversationRow.project_id == project_id)
        ),
        ConversationItemRow.created_at < cutoff,
    )
    if dry_run:
        return int(db.scalar(select(func.count()).select_from(ConversationItemRow).where(*where)))
    done = db.execute(delete(ConversationItemRow).where(*where))
    return int(done.rowcount or 0)


def purge_payloads(
    factory: sessionmaker[Session],
    *,
    default_days: int | None,
    override_days: int | None = None,
    project: str | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    max_rows: int | None = None,
    actor: str = "system",
) -> list[ProjectPurge]:
    """Purge every project (or ``project``) that has retention; ``override_days`` wins
    over the settings. ``max_rows`` bounds the rows purged in this call (all projects)."""
    check_days(override_days, "--days")
    with factory() as db:
        q = select(ProjectRow.id, ProjectRow.settings).order_by(ProjectRow.id)
        if project is not None:
            q = q.where(ProjectRow.id == project)
        projects = db.execute(q).all()
    if project is not None and not projects:
        raise RetentionConfigError(f"no project {project!r}")
    results: list[ProjectPurge] = []
    budget = max_rows
    for pid, settings in projects:
        if override_days is not None:
            days: int | None = override_days
        else:
            try:
                days = project_days(settings, default_days)
            except RetentionConfigError as e:
                if project is not None:
                    raise
                log.error("retention skipped for project %s: %s", pid, e)
                continue
        if days is None:
            continue
        r = purge_project(
            factory,
            pid,
            days,
            now=now,
            dry_run=dry_run,
            batch_size=batch_size,
            max_rows=budget,
            actor=actor,
        )
        results.append(r)
        if budget is not None and not dry_run:
            budget = max(0, budget - r.purged)
    return results


def run_scheduled() -> list[dict[str, Any]]:
    """The beat job: every project with retention, at most MAX_ROWS_PER_RUN rows."""
    from core.settings import get_settings
    from trainer.serving_switch import db_factory  # the database, as the other trainer tasks

    settings = get_settings()
    results = purge_payloads(
        db_factory(settings),
        default_days=settings.retention_days,
        max_rows=MAX_ROWS_PER_RUN,
    )
    for r in results:
        if r.purged:
            log.info("retention: purged %d interactions of %s", r.purged, r.project_id)
    return [{**asdict(r), "cutoff": r.cutoff.isoformat()} for r in results]


def register(app: Any) -> None:
    """Register the task and its daily beat entry on the Celery app."""
    app.task(name=TASK_NAME)(run_scheduled)
    app.conf.beat_schedule = {
        **(app.conf.beat_schedule or {}),
        "rlgate-retention": {"task": TASK_NAME, "schedule": EVERY_S},
    }
