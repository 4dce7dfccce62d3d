"""`rlgate migrate` on fresh SQLite and PostgreSQL; models and migrations agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from core.db import make_engine
from core.migrate import alembic_config, downgrade, upgrade
from schemas.tables import Base

TABLES = {
    "projects",
    "api_keys",
    "sessions",
    "interactions",
    "feedback",
    "policy_versions",
    "training_runs",
    "audit_events",
    "judge_calls",
    "verify_leases",
    "conversations",
    "conversation_items",
    "response_deletions",
    "run_hints",
}
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _diff(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def test_cli_migrate_creates_full_schema(db_url, monkeypatch):
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    out = subprocess.run(
        [sys.executable, "-m", "rlgate.cli", "migrate"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
    assert head == sorted(p.name[:4] for p in MIGRATIONS.glob("0*.py"))[-1]  # one head
    assert f"revision {head}" in out.stdout
    assert _tables(db_url) == TABLES


def test_upgrade_downgrade_upgrade(db_url):
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    assert _diff(db_url) == []


def test_indexes_for_hot_queries(db_url):
    upgrade(db_url)
    engine = make_engine(db_url)
    insp = inspect(engine)
    names = {t: {ix["name"] for ix in insp.get_indexes(t)} for t in TABLES}
    uniques = {t: {u["name"] for u in insp.get_unique_constraints(t)} for t in TABLES}
    engine.dispose()
    assert "uq_api_keys_key_hash" in uniques["api_keys"] | names["api_keys"]
    assert "ix_sessions_project_created" in names["sessions"]
    assert "uq_interactions_session_seq" in uniques["interactions"] | names["interactions"]
    assert "ix_interactions_trainable" in names["interactions"]
    assert "ix_feedback_target" in names["feedback"]


def test_models_match_migrations_on_postgres(pg_url):
    upgrade(pg_url)
    assert _diff(pg_url) == []
