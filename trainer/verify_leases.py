"""Each project's share of the verify pool: at most RLGATE_VERIFY_PER_PROJECT of its
verify tasks run at once, whatever its judge or command costs.

A task takes a slot (a ``verify_leases`` row; the primary key makes two takers of one
slot impossible, on SQLite and PostgreSQL alike) before it runs and gives it back after.
A task that finds every slot of its project taken is put back on the queue for later
(trainer/tasks.py), so it never holds a pool process while it waits. A task killed at its
hard time limit leaves its row until ``expires_at``, which is past that limit.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from schemas.coltypes import utcnow
from schemas.tables import VerifyLeaseRow


def acquire(
    factory: sessionmaker[Session], project_id: str, slots: int, ttl_s: float, holder: str
) -> int | None:
    """The slot taken for ``holder``, or None when all ``slots`` of the project are held."""
    now = utcnow()
    with factory() as db, db.begin():
        db.execute(
            delete(VerifyLeaseRow).where(
                VerifyLeaseRow.project_id == project_id, VerifyLeaseRow.expires_at < now
            )
        )
    for slot in range(slots):
        try:
            with factory() as db, db.begin():
                db.add(
                    VerifyLeaseRow(
                        project_id=project_id,
                        slot=slot,
                        holder=holder[:200],
                        expires_at=now + timedelta(seconds=ttl_s),
                    )
                )
            return slot
        except IntegrityError:
            continue
    return None


def release(factory: sessionmaker[Session], project_id: str, slot: int, holder: str) -> None:
    with factory() as db, db.begin():
        db.execute(
            delete(VerifyLeaseRow).where(
                VerifyLeaseRow.project_id == project_id,
                VerifyLeaseRow.slot == slot,
                VerifyLeaseRow.holder == holder[:200],
            )
        )
