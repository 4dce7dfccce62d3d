"""One batch of spooled records into the database, in the caller's transaction.

Idempotent: interactions whose id is already there are skipped, so replaying a spool
segment twice writes nothing new. Sessions that new calls opened travel with their first
interaction and are inserted when missing; ``seq`` is numbered per session in creation
order, and each session's ``last_activity_at`` only moves forward. It also names the
turns it wrote that follow an earlier turn of their session (:class:`Followup`): the
gateway's next-turn dispatch (gateway/recording/next_turn.py) takes them after the commit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from gateway.recording.retries import mark_retries
from gateway.recording.spool import SpoolRecord
from schemas.atdp import Interaction
from schemas.atdp import Session as SessionRecord
from schemas.convert import row_values
from schemas.tables import InteractionRow, SessionRow


class Followup(NamedTuple):
    """A written turn that follows an earlier one of its session (a parent, or not the
    session's first record): one per request (its first choice), never an aborted one."""

    project_id: str
    session_id: str
    interaction_id: str


def write_batch(db: Session, entries: list[SpoolRecord]) -> tuple[int, set[str], list[Followup]]:
    """Insert what is not in the database yet: the sessions new calls opened, then the
    interactions. Returns (interactions inserted, ids of the sessions carried along, the
    inserted turns that follow an earlier turn)."""
    carried = {s["id"]: s for e in entries if (s := e["session"])}
    if carried:
        have = set(db.scalars(select(SessionRow.id).where(SessionRow.id.in_(list(carried)))))
        new = [
            row_values(SessionRecord.model_validate(row))
            for sid, row in carried.items()
            if sid not in have
        ]
        if new:  # one executemany, as the interactions below
            db.execute(insert(SessionRow), new)
    records = [e["interaction"] for e in entries]
    ids = [r["id"] for r in records]
    existing = set(db.scalars(select(InteractionRow.id).where(InteractionRow.id.in_(ids))))
    fresh = [r for r in records if r["id"] not in existing]
    if not fresh:
        return 0, set(carried), []
    sessions = {r["session_id"] for r in fresh}
    next_seq = dict(
        db.execute(
            select(InteractionRow.session_id, func.max(InteractionRow.seq))
            .where(InteractionRow.session_id.in_(sessions))
            .group_by(InteractionRow.session_id)
        ).all()
    )
    last_activity: dict[str, Any] = {}
    rows = []
    for r in sorted(fresh, key=lambda r: (r["created_at"], r.get("choice_index", 0))):
        record = Interaction.model_validate({**r, "seq": 0})
        seq = next_seq.get(r["session_id"])
        seq = 0 if seq is None else seq + 1
        next_seq[r["session_id"]] = seq
        rows.append({**record.model_dump(mode="python", exclude={"atdp_version"}), "seq": seq})
        prev = last_activity.get(record.session_id)
        last_activity[record.session_id] = (
            max(prev, record.created_at) if prev else record.created_at
        )
    # Core statements, one executemany each: no ORM unit of work or session synchronization
    db.execute(insert(InteractionRow.__table__), rows)
    sessions_table = SessionRow.__table__
    db.execute(
        update(sessions_table)
        .where(
            sessions_table.c.id == bindparam("sid"),
            sessions_table.c.last_activity_at < bindparam("at"),
        )
        .values(last_activity_at=bindparam("at")),
        [{"sid": sid, "at": at} for sid, at in last_activity.items()],
    )
    mark_retries(db, rows)  # an SDK's resend supersedes the answer it never received
    followups = [
        Followup(r["project_id"], r["session_id"], r["id"])
        for r in rows
        if (r["seq"] > 0 or r.get("parent_id"))
        and r.get("choice_index", 0) == 0
        and r.get("finish_reason") != "abort"
    ]
    return len(fresh), set(carried), followups
