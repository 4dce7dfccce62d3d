"""Shared fixtures: real PostgreSQL (fresh database per use) and SQLite files.

PostgreSQL is taken from RLGATE_TEST_PG_URL (default: postgresql://postgres@127.0.0.1:5432,
trust auth, as on the development machines and CI). It is required, not optional: a test
that needs it fails when it is down (`.ci/run` starts it).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

PG_BASE = os.environ.get("RLGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


def pytest_report_header(config: pytest.Config) -> str:
    from core.engine_protocol import SGLANG_VERSION

    where = os.environ.get("RLGATE_TEST_SGLANG_PYTHON") or "scripts/sglang_cpu_venv"
    return f"real-SGLang tier: sglang {SGLANG_VERSION} ({where})"


@pytest.fixture(scope="session")
def sglang(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real SGLang server for the whole session (tests/sglang.py): the engine
    contract and the end-to-end tests share it; it fails, never skips, if SGLang cannot
    start. Its version must be the one rlgate's contract names."""
    from core.engine_protocol import SGLANG_VERSION
    from tests.sglang import sglang_server

    log = tmp_path_factory.mktemp("sglang") / "sglang.log"
    with sglang_server(log) as server:
        assert server.version == SGLANG_VERSION, (
            f"the SGLang under test is {server.version}; the contract is {SGLANG_VERSION}"
        )
        yield server


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path, monkeypatch) -> Iterator[None]:
    """Each test gets its own data dir, its own XDG_STATE_HOME (so it never sees a
    developer's running stacks, rlgate/stack.py) and no stray RLGATE_* settings; what a
    command run in-process adopted from a stack is undone after it."""
    from core.settings import get_settings
    from rlgate import stack

    for name in list(os.environ):
        if name.startswith("RLGATE_") and not name.startswith("RLGATE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLGATE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    get_settings.cache_clear()
    yield
    for name in stack.APPLIED:
        os.environ.pop(name, None)
    stack.APPLIED.clear()
    stack.ADOPTED.clear()
    get_settings.cache_clear()


def _admin_conn() -> psycopg.Connection:
    return psycopg.connect(f"{PG_BASE}/postgres", autocommit=True, connect_timeout=5)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped afterwards."""
    name = f"rlgate_test_{secrets.token_hex(6)}"
    with _admin_conn() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{PG_BASE}/{name}"
    finally:
        with _admin_conn() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Runs the test once on a fresh SQLite file and once on a fresh PostgreSQL database."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def migrated_db(db_url):  # type: ignore[no-untyped-def]
    """A session factory on a freshly migrated database (both backends)."""
    from core.db import make_engine, session_factory
    from core.migrate import upgrade

    upgrade(db_url)
    engine = make_engine(db_url)
    yield session_factory(engine)
    engine.dispose()
