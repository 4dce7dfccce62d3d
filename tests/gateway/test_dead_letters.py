"""The recorder survives records the database refuses (gateway.recording.recorder,
gateway.recording.dead_letters).

In-process recorders on a real database (SQLite file and PostgreSQL): refused records go
to the dead-letter file and are counted, everything else is written; orphan spool
segments are replayed at start-up (never fatally) and periodically; the backlog is
capped in bytes. On both backends a record whose project does not exist (a foreign-key
violation) and one that is not an ATDP record are refused; on PostgreSQL also a session
id over its String(200) column and a NUL character, which it cannot store.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.errors import APIError
from core.keys import ensure_project
from gateway.recording.recorder import Recorder
from schemas.tables import InteractionRow, SessionRow
from tests.gateway.records import entry, iid


def _recorder(factory, tmp_path: Path, **kw) -> tuple[Recorder, list[int]]:  # type: ignore[no-untyped-def]
    counted: list[int] = []
    rec = Recorder(
        factory,
        tmp_path / "spool",
        fsync=False,
        dead_letter_path=tmp_path / "dead_letters.jsonl",
        on_dead_letter=lambda: counted.append(1),
        **kw,
    )
    return rec, counted


def _stored(factory, ids: list[str]) -> set[str]:  # type: ignore[no-untyped-def]
    with factory() as db:
        return set(db.scalars(select(InteractionRow.id).where(InteractionRow.id.in_(ids))))


def _bad_entries(db_url: str) -> list[dict]:
    bad = [entry(project="no-such-project"), {"interaction": {"id": "broken"}, "session": None}]
    if db_url.startswith("postgresql"):
        bad += [entry(external_id="x" * 300), entry(content="NUL \x00 here")]
    return bad


@pytest.fixture
def factory(migrated_db):  # type: ignore[no-untyped-def]
    with transaction(migrated_db) as db:
        ensure_project(db, "p1")
    return migrated_db


def test_refused_records_are_dead_lettered_and_the_rest_recorded(db_url, factory, tmp_path):
    rec, counted = _recorder(factory, tmp_path)
    good = [entry() for _ in range(6)]
    bad = _bad_entries(db_url)
    mixed = [e for pair in zip(good, bad + [None] * len(good), strict=False) for e in pair if e]
    # queued before the writer starts: they reach the database as one batch
    asyncio.run(rec.record(mixed))
    rec.start()
    try:
        assert rec.flush(60), "recording stalled behind a refused record"
        assert _stored(factory, [iid(e) for e in good]) == {iid(e) for e in good}
        lines = [json.loads(x) for x in (tmp_path / "dead_letters.jsonl").read_text().splitlines()]
        assert len(lines) == len(bad) == len(counted) == rec.dead_letters.count
        assert [x["record"] for x in lines] == bad  # in order, as they were spooled
        assert all(x["reason"] and x["at"] for x in lines)
        if db_url.startswith("postgresql"):
            reasons = " ".join(x["reason"] for x in lines)
            assert "DataError" in reasons and "IntegrityError" in reasons
        assert any("refused by the database" in p for p in rec.problems())
        # recording goes on: a later record is written
        later = entry()
        asyncio.run(rec.record([later]))
        assert rec.flush(30)
        assert _stored(factory, [iid(later)]) == {iid(later)}
        assert rec.backlog_bytes == 0
    finally:
        rec.stop()
    assert not list((tmp_path / "spool").glob("segment-*.jsonl"))


def _segment(spool: Path, entries: list[dict], extra: bytes = b"") -> Path:
    spool.mkdir(parents=True, exist_ok=True)
    path = spool / f"segment-{time.time_ns()}-999999.jsonl"
    lines = [json.dumps(e, separators=(",", ":")).encode() for e in entries]
    path.write_bytes(b"\n".join(lines) + b"\n" + extra)
    return path


def test_start_up_replays_a_poisoned_segment_without_failing(db_url, factory, tmp_path):
    good = [entry() for _ in range(3)]
    bad = _bad_entries(db_url)
    path = _segment(tmp_path / "spool", [good[0], bad[0], good[1], *bad[1:], good[2]], b'{"torn')
    with path.open("r+b") as fh:  # a corrupt line in the middle is kept too, as raw text
        data = fh.read().replace(b"\n", b"\nnot json\n", 1)
        fh.seek(0)
        fh.write(data)
    rec, counted = _recorder(factory, tmp_path)
    rec.start()  # must not raise
    try:
        assert _stored(factory, [iid(e) for e in good]) == {iid(e) for e in good}
        assert not path.exists()
        assert rec.dead_letters.count == len(counted) == len(bad) + 1  # + the corrupt line
        # idempotent: the same segment again writes nothing twice and refuses the same
        _segment(tmp_path / "spool", [*good, *bad])
        assert rec.replay_orphans() == 0
        assert rec.dead_letters.count == 2 * len(bad) + 1
    finally:
        rec.stop()


def test_orphan_segments_are_replayed_periodically(factory, tmp_path):
    rec, _ = _recorder(factory, tmp_path, replay_interval_s=0.2)
    rec.start()
    try:
        e = entry()
        path = _segment(tmp_path / "spool", [e])  # as if left by a gateway that died now
        deadline = time.monotonic() + 30
        while not _stored(factory, [iid(e)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stored(factory, [iid(e)]) == {iid(e)}
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not path.exists()
    finally:
        rec.stop()


def test_backlog_over_its_cap_refuses_new_calls_until_written(factory, tmp_path):
    rec, _ = _recorder(factory, tmp_path, backlog_max_bytes=500)
    rec.admit()
    asyncio.run(rec.record([entry(content="x" * 1000)]))  # the writer is not running yet
    assert rec.backlog_bytes > 500
    with pytest.raises(APIError) as e:
        rec.admit()
    assert e.value.status == 503 and "retry" in e.value.message
    assert e.value.headers.get("Retry-After")
    assert any("over its cap" in p for p in rec.problems())
    rec.start()
    try:
        assert rec.flush(30)
        assert rec.backlog_bytes == 0
        rec.admit()
    finally:
        rec.stop()


def test_unreachable_database_is_retried_not_dead_lettered(tmp_path):
    """Connection errors keep records in the spool: start-up goes on, nothing is refused."""
    engine = make_engine("postgresql://postgres@127.0.0.1:1/none?connect_timeout=2")
    rec, counted = _recorder(session_factory(engine), tmp_path)
    path = _segment(tmp_path / "spool", [entry()])
    rec.start()
    try:
        assert path.exists()  # kept for a later round
        assert rec.dead_letters.count == 0 and not counted
        assert not (tmp_path / "dead_letters.jsonl").exists()
    finally:
        rec.stop(timeout=5)
        engine.dispose()


def test_sessions_of_refused_records_are_not_left_half_written(db_url, factory, tmp_path):
    """A refused interaction does not leave the session it opened behind alone."""
    rec, _ = _recorder(factory, tmp_path)
    bad = entry()
    bad["interaction"]["usage"] = {"prompt_tokens": -1, "completion_tokens": 0}  # invalid
    asyncio.run(rec.record([bad]))
    rec.start()
    try:
        assert rec.flush(30)
        with factory() as db:
            assert db.get(SessionRow, bad["session"]["id"]) is None
        assert rec.dead_letters.count == 1
    finally:
        rec.stop()
