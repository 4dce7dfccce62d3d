"""Commit tickets (gateway.recording.commits): the recorder tells a request when its records are in
the database, and never holds it while the database is unreachable.

In-process recorders on a real database (SQLite file and PostgreSQL), and one on a
PostgreSQL port nothing listens on.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import ensure_project
from gateway.recording.recorder import Recorder
from schemas.tables import InteractionRow, SessionRow
from tests.gateway.records import entry, iid
from tests.servers import free_port


@pytest.fixture
def factory(migrated_db):  # type: ignore[no-untyped-def]
    with transaction(migrated_db) as db:
        ensure_project(db, "p1")
    return migrated_db


def _in_db(factory, entries: list[dict]) -> tuple[set[str], set[str]]:  # type: ignore[no-untyped-def]
    """(interaction ids, session ids) of ``entries`` that are committed."""
    ids = [iid(e) for e in entries]
    sids = [e["interaction"]["session_id"] for e in entries]
    with factory() as db:
        found = set(db.scalars(select(InteractionRow.id).where(InteractionRow.id.in_(ids))))
        sessions = set(db.scalars(select(SessionRow.id).where(SessionRow.id.in_(sids))))
    return found, sessions


@pytest.mark.parametrize("fsync", [False, True])
def test_a_ticket_settles_once_its_records_are_committed(factory, tmp_path, fsync):
    rec = Recorder(
        factory, tmp_path / "spool", fsync=fsync, dead_letter_path=tmp_path / "dead.jsonl"
    )
    rec.start()
    try:

        async def run() -> list[tuple[bool | None, set[str], set[str]]]:
            async def one(k: int) -> tuple[bool | None, set[str], set[str]]:
                # n=3 choices of one call, and one record the database refuses (no project)
                records = [entry(), entry(), entry()] if k % 2 else [entry(project="nope")]
                ticket = await rec.record(records)
                outcome = await ticket.wait(60)
                found, sessions = _in_db(factory, records)  # right when the answer would go
                good = records if k % 2 else []
                want = {iid(e) for e in good}, {e["interaction"]["session_id"] for e in good}
                return outcome, found ^ want[0], sessions ^ want[1]

            return await asyncio.gather(*[one(k) for k in range(16)])

        for outcome, missing, missing_sessions in asyncio.run(run()):
            assert outcome is True
            assert missing == set() and missing_sessions == set()
        assert rec.dead_letters.count == 8  # the refused records settled their tickets too
        assert len(rec.tickets) == 0
    finally:
        rec.stop()


def test_a_ticket_waits_for_the_writer(factory, tmp_path):
    """Before the writer runs nothing is committed: a short wait ends unsettled (None);
    once the writer runs, the same ticket settles committed."""
    rec = Recorder(factory, tmp_path / "spool", fsync=False)
    e = entry()

    async def before() -> tuple[object, bool | None]:
        ticket = await rec.record([e])
        return ticket, await ticket.wait(0.2)

    async def after() -> bool | None:
        ticket = await rec.record([entry()])
        rec.start()
        return await ticket.wait(60)

    try:
        _, outcome = asyncio.run(before())
        assert outcome is None and _in_db(factory, [e])[0] == set()
        assert asyncio.run(after()) is True
        assert _in_db(factory, [e])[0] == {iid(e)}
    finally:
        rec.stop()


def test_an_unreachable_database_settles_tickets_at_once_and_keeps_the_records(tmp_path):
    """No database: every ticket settles as not committed (False, not a timeout), the
    records stay in the spool (and pending, for the in-process waits)."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    engine = make_engine(url)
    rec = Recorder(session_factory(engine), tmp_path / "spool", fsync=False)
    rec.start()
    first, second = entry(), entry()
    try:

        async def run() -> list[bool | None]:
            t1 = await rec.record([first])
            o1 = await t1.wait(120)  # settled by the writer's first failed connection
            t2 = await rec.record([second])  # the database is known to be down
            return [o1, await t2.wait(120)]

        assert asyncio.run(run()) == [False, False]
        spooled = [
            json.loads(line)
            for seg in (tmp_path / "spool").glob("segment-*.jsonl")
            for line in seg.read_text().splitlines()
        ]
        assert {iid(x) for x in spooled} == {iid(first), iid(second)}
        assert rec.has_pending
    finally:
        rec.stop(timeout=1)
        engine.dispose()


def test_one_record_call_is_never_split_between_transactions(factory, tmp_path):
    """The records of one ``record()`` (a call's choices, a Completions batch) are
    written in one transaction even when they are more than the writer's batch."""
    rec = Recorder(
        factory,
        tmp_path / "spool",
        batch_max=2,
        fsync=False,
        dead_letter_path=tmp_path / "dead.jsonl",
    )
    written: list[set[str]] = []
    store = rec._store

    def watched(records, patient=True):  # type: ignore[no-untyped-def]
        written.append({iid(r) for r in records})
        return store(records, patient)

    rec._store = watched  # type: ignore[method-assign]
    rec.start()
    try:

        async def run() -> list[list[dict]]:
            units = [[entry() for _ in range(3)] for _ in range(6)]
            tickets = await asyncio.gather(*[rec.record(u) for u in units])
            assert all(await asyncio.gather(*[t.wait(60) for t in tickets]))
            return units

        units = asyncio.run(run())
    finally:
        rec.stop()
    for unit in units:
        ids = {iid(e) for e in unit}
        assert any(ids <= batch for batch in written), (ids, written)
        assert _in_db(factory, unit)[0] == ids
