"""Key lifecycle on SQLite and PostgreSQL: minted keys die with their parent, session keys
with their session (after the grace period), and a key list never shows a key whole."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, text, update

from core.db import make_engine
from core.keys import (
    MIN_CHOSEN_LEN,
    PREFIX_MAX,
    create_key,
    display_prefix,
    ensure_project,
    hash_secret,
    lookup_key,
    revoke_key,
)
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.tables import ApiKeyRow, AuditEventRow, SessionRow


def _session(db, sid: str, project: str = "p1", status: str = "open", closed_ago_s: float = 0):  # type: ignore[no-untyped-def]
    ensure_project(db, project)
    now = utcnow()
    db.add(
        SessionRow(
            id=sid,
            project_id=project,
            status=status,
            created_at=now - timedelta(hours=3),
            last_activity_at=now - timedelta(seconds=closed_ago_s),
            closed_at=None if status == "open" else now - timedelta(seconds=closed_ago_s),
            meta={},
        )
    )


def test_revoking_a_parent_revokes_the_keys_it_minted(migrated_db):
    with migrated_db() as db, db.begin():
        parent, parent_secret = create_key(db, "p1", "agent")
        _session(db, "sess_a")
        _session(db, "sess_b")
        child, child_secret = create_key(
            db, "p1", "agent", session_id="sess_a", parent_key_id=parent.id
        )
        grandchild, grand_secret = create_key(
            db, "p1", "agent", session_id="sess_b", parent_key_id=child.id
        )
        other, other_secret = create_key(db, "p1", "agent")
    with migrated_db() as db, db.begin():
        assert lookup_key(db, grand_secret) is not None
        revoke_key(db, parent.id, actor="test")
    with migrated_db() as db:
        for secret in (parent_secret, child_secret, grand_secret):
            assert lookup_key(db, secret) is None
        assert lookup_key(db, other_secret) is not None
        revoked = set(
            db.scalars(select(ApiKeyRow.id).where(ApiKeyRow.revoked_at.is_not(None))).all()
        )
        assert revoked == {parent.id, child.id, grandchild.id}
        audited = db.scalars(
            select(AuditEventRow.target_id).where(AuditEventRow.action == "key.revoke")
        ).all()
        assert sorted(audited) == sorted([parent.id, child.id, grandchild.id])


def test_a_parent_revoked_behind_our_back_still_stops_its_children(migrated_db):
    """Authentication checks the parent chain itself, not only the cascade at revoke."""
    with migrated_db() as db, db.begin():
        parent, _ = create_key(db, "p1", "admin")
        _session(db, "sess_c")
        _, child_secret = create_key(
            db, "p1", "agent", session_id="sess_c", parent_key_id=parent.id
        )
    with migrated_db() as db, db.begin():
        db.execute(update(ApiKeyRow).where(ApiKeyRow.id == parent.id).values(revoked_at=utcnow()))
    with migrated_db() as db:
        assert lookup_key(db, child_secret) is None


def test_a_session_key_stops_after_its_session_ended_and_the_grace(migrated_db):
    with migrated_db() as db, db.begin():
        _session(db, "sess_open")
        _session(db, "sess_just_closed", status="closed", closed_ago_s=5)
        _session(db, "sess_long_closed", status="expired", closed_ago_s=7200)
        keys = {
            sid: create_key(db, "p1", "agent", session_id=sid)[1]
            for sid in ("sess_open", "sess_just_closed", "sess_long_closed")
        }
    with migrated_db() as db:
        assert lookup_key(db, keys["sess_open"], session_grace_s=0) is not None
        assert lookup_key(db, keys["sess_just_closed"], session_grace_s=3600) is not None
        assert lookup_key(db, keys["sess_just_closed"], session_grace_s=0) is None
        assert lookup_key(db, keys["sess_long_closed"], session_grace_s=3600) is None


def test_display_prefix_never_shows_more_than_a_quarter_or_eight_chars():
    for n in range(1, 120):
        secret = "k" * n
        shown = display_prefix(secret)
        assert len(shown) <= min(PREFIX_MAX, n // 4)
    chosen = "sk-" + "a" * (MIN_CHOSEN_LEN - 3)
    assert display_prefix(chosen) == "sk-aaaaa"


def test_generated_keys_store_an_eight_char_prefix(migrated_db):
    with migrated_db() as db, db.begin():
        row, secret = create_key(db, "p1", "feedback")
    assert row.prefix == secret[:8] == "rlg_feed"


def test_migration_0002_shortens_old_prefixes(db_url):
    """Rows written before 0002 (12-character prefixes) are cut to what a list may show."""
    upgrade(db_url, "0001")
    engine = make_engine(db_url)
    try:
        now = utcnow()
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO projects (id, name, settings, created_at, training_paused)"
                    " VALUES (:i, :i, :s, :t, :f)"
                ),
                {"i": "p1", "s": "{}", "t": now, "f": False},
            )
            for kid, prefix in (("key_gen", "rlg_agent_Ab3"), ("key_short", "sk-12345")):
                conn.execute(
                    text(
                        "INSERT INTO api_keys (id, project_id, kind, key_hash, prefix, created_at)"
                        " VALUES (:i, 'p1', 'agent', :h, :p, :t)"
                    ),
                    {"i": kid, "h": hash_secret(kid), "p": prefix, "t": now},
                )
        upgrade(db_url)
        with engine.connect() as conn:
            got = dict(conn.execute(select(ApiKeyRow.id, ApiKeyRow.prefix)).all())
            parents = conn.execute(select(ApiKeyRow.parent_key_id)).scalars().all()
    finally:
        engine.dispose()
    assert got == {"key_gen": "rlg_agen", "key_short": "sk"}
    assert parents == [None, None]
