"""API keys: hash-only storage, lookup by hash, revocation, nothing secret in logs."""

from __future__ import annotations

import logging
import subprocess
import sys

from sqlalchemy import event, select, text

from core.keys import create_key, hash_secret, lookup_key, revoke_key
from schemas.tables import ApiKeyRow, AuditEventRow


def _dump_all(db) -> str:
    """Every value of every table, as text (to look for leaked secrets)."""
    parts = []
    for table in ("projects", "api_keys", "audit_events"):
        for row in db.execute(text(f"SELECT * FROM {table}")):
            parts.append(" ".join(str(v) for v in row))
    return "\n".join(parts)


def test_secret_never_stored_and_lookup_by_hash(migrated_db, caplog):
    caplog.set_level(logging.DEBUG)
    with migrated_db() as db, db.begin():
        row, secret = create_key(db, "p1", "agent", name="laptop")
    assert secret.startswith("rlg_agent_") and len(secret) > 40
    with migrated_db() as db:
        stored = db.get(ApiKeyRow, row.id)
        assert stored.key_hash == hash_secret(secret)
        assert secret not in _dump_all(db)
        assert secret[PREFIX_CHECK:] not in _dump_all(db)

        statements: list[tuple[str, object]] = []
        engine = db.get_bind()

        def capture(conn, cursor, statement, params, context, executemany):
            statements.append((statement, params))

        event.listen(engine, "before_cursor_execute", capture)
        try:
            found = lookup_key(db, secret)
            missing = lookup_key(db, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
        finally:
            event.remove(engine, "before_cursor_execute", capture)
    assert found is not None and found.id == row.id and found.kind == "agent"
    assert missing is None
    # the secret itself never reaches the database: lookup is an equality on the hash
    for statement, params in statements:
        assert "key_hash" in statement
        assert secret not in str(params)
    assert secret not in caplog.text


PREFIX_CHECK = 12  # everything after the displayed prefix must be absent


def test_revoked_key_stops_working(migrated_db):
    with migrated_db() as db, db.begin():
        row, secret = create_key(db, "p1", "feedback")
    with migrated_db() as db, db.begin():
        assert lookup_key(db, secret) is not None
        revoke_key(db, row.id)
    with migrated_db() as db:
        assert lookup_key(db, secret) is None
        actions = db.scalars(select(AuditEventRow.action).order_by(AuditEventRow.created_at)).all()
    assert actions == ["key.create", "key.revoke"]


def test_cli_keys_create_list_revoke(sqlite_url, monkeypatch):
    monkeypatch.setenv("RLGATE_DATABASE_URL", sqlite_url)

    def rlgate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlgate.cli", *args], capture_output=True, text=True
        )

    assert rlgate("migrate").returncode == 0
    created = rlgate("keys", "create", "--project", "demo", "--kind", "admin")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("rlg_admin_")
    key_id = created.stderr.split()[3]
    assert key_id.startswith("key_")

    listed = rlgate("keys", "list")
    assert key_id in listed.stdout and "active" in listed.stdout
    assert secret not in listed.stdout and secret[PREFIX_CHECK:] not in listed.stdout

    assert rlgate("keys", "revoke", key_id).returncode == 0
    assert key_id not in rlgate("keys", "list").stdout
    assert "revoked" in rlgate("keys", "list", "--all").stdout

    from core.db import make_engine, session_factory

    engine = make_engine(sqlite_url)
    with session_factory(engine)() as db:
        assert lookup_key(db, secret) is None
        assert secret not in _dump_all(db)
    engine.dispose()

    missing = rlgate("keys", "revoke", "key_nope")
    assert missing.returncode == 2 and "no key with id key_nope" in missing.stderr


def test_a_chain_ends_with_the_session_it_hangs_from(migrated_db):
    """Issue 36, finding 3: a key minted below a session-bound key (older data) stops when
    that session has ended (past the grace), at every depth; an open one keeps it."""
    from datetime import timedelta

    from core.keys import ensure_project, key_usable
    from schemas.coltypes import utcnow
    from schemas.convert import to_row
    from schemas.tables import SessionRow
    from tests.rows import session

    with migrated_db() as db, db.begin():
        ensure_project(db, "p1")
        db.flush()
        for sid in ("sa", "sc", "sd"):
            db.add(to_row(session(sid, "p1")))
        db.flush()
        agent, _ = create_key(db, "p1", "agent")
        a, _ = create_key(db, "p1", "agent", session_id="sa", parent_key_id=agent.id)
        c, _ = create_key(db, "p1", "agent", session_id="sc", parent_key_id=a.id)
        d, _ = create_key(db, "p1", "agent", session_id="sd", parent_key_id=c.id)
        ids = [agent.id, a.id, c.id, d.id]

    def usable(grace: float = 3600.0) -> list[bool]:
        with migrated_db() as db:
            return [key_usable(db, db.get(ApiKeyRow, i), grace) for i in ids]

    assert usable() == [True, True, True, True]
    with migrated_db() as db, db.begin():
        row = db.get(SessionRow, "sa")
        row.status = "closed"
        row.closed_at = utcnow() - timedelta(seconds=60)
    assert usable() == [True, True, True, True]  # within the grace: late feedback
    assert usable(grace=10) == [True, False, False, False]  # past it: the whole chain
