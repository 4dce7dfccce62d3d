"""The dashboard lists' filters, declared once per list (``Filters``): read from the query
string (params.py ``filters_of``) and applied by the queries, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request

from core.db import transaction
from gateway.admin import queries
from gateway.admin.params import LISTS, filters_of
from schemas.tables import ApiKeyRow, FeedbackRow, ProjectRow, SessionRow, TrainingRunRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _request(query: str) -> Request:
    return Request({"type": "http", "query_string": query.encode(), "headers": []})


def _seed(factory: Any) -> None:
    with transaction(factory) as db:
        db.add_all([ProjectRow(id="p1", name="p1"), ProjectRow(id="p2", name="p2")])
        db.flush()
        for i, (pid, status, agent) in enumerate(
            [("p1", "open", "a"), ("p1", "closed", "a"), ("p1", "closed", "b"), ("p2", "open", "a")]
        ):
            at = T0 + timedelta(hours=i)
            db.add(
                SessionRow(
                    id=f"s{i}", project_id=pid, status=status, agent_name=agent,
                    created_at=at, last_activity_at=at,
                )
            )  # fmt: skip
        for i, (source, sid) in enumerate([("user", "s0"), ("judge", "s1"), ("user", "s3")]):
            db.add(
                FeedbackRow(
                    id=f"f{i}", project_id="p2" if sid == "s3" else "p1", target_type="session",
                    target_id=sid, session_id=sid, value=1, scale="binary", reward=1.0,
                    source=source, created_at=T0 + timedelta(hours=i),
                )
            )  # fmt: skip
        for i, trigger in enumerate(["manual", "threshold", "threshold"]):
            db.add(TrainingRunRow(id=f"r{i}", project_id="p1", trigger=trigger, status="failed"))
        for i, revoked in enumerate([None, T0]):
            db.add(
                ApiKeyRow(
                    id=f"k{i}", project_id="p1", kind="agent", key_hash=f"h{i}", prefix="rlg",
                    revoked_at=revoked,
                )
            )  # fmt: skip


def _ids(page: queries.Page) -> list[str]:
    return sorted(item["id"] for item in page.items)


def test_query_string_gives_each_declared_filter() -> None:
    got = filters_of(
        _request("project=p1&status=&rated=yes&since=2026-01-01T01:00"), LISTS["sessions"].filters
    )
    assert got == {
        "project": "p1",
        "status": None,  # empty means unset
        "agent": None,
        "rated": "yes",
        "since": T0 + timedelta(hours=1),
        "until": None,
    }
    keys = filters_of(_request("kind=agent&revoked=1"), LISTS["keys"].filters)
    assert keys == {
        "project": None,
        "kind": "agent",
        "include_revoked": True,
        "include_session_keys": False,
    }
    assert "since" not in filters_of(_request("since=2026-01-01"), LISTS["runs"].filters)


def test_lists_apply_their_filters(migrated_db: Any) -> None:
    _seed(migrated_db)
    with migrated_db() as db:
        assert _ids(queries.sessions(db, None, {})) == ["s0", "s1", "s2", "s3"]
        assert _ids(queries.sessions(db, ["p1"], {})) == ["s0", "s1", "s2"]  # the scope
        closed = {"project": "p1", "status": "closed", "agent": "b"}
        assert _ids(queries.sessions(db, None, closed)) == ["s2"]
        window = {"since": T0 + timedelta(hours=1), "until": T0 + timedelta(hours=3)}
        assert _ids(queries.sessions(db, None, window)) == ["s1", "s2"]
        assert _ids(queries.sessions(db, None, {"rated": "yes"})) == ["s0", "s1", "s3"]
        assert _ids(queries.sessions(db, None, {"rated": "no"})) == ["s2"]
        assert _ids(queries.feedback(db, None, {"source": "user"})) == ["f0", "f2"]
        assert _ids(queries.feedback(db, ["p1"], {"source": "user"})) == ["f0"]
        assert _ids(queries.runs(db, None, {"trigger": "threshold"})) == ["r1", "r2"]
        assert _ids(queries.keys(db, None, {})) == ["k0"]  # revoked keys hidden by default
        assert _ids(queries.keys(db, None, {"include_revoked": True})) == ["k0", "k1"]
