"""Shared fixtures: real PostgreSQL (fresh database per use) and SQLite files.

PostgreSQL is taken from RLGATE_TEST_PG_URL (default: postgresql://postgres@127.0.0.1:5432,
trust auth, as on the development machines and CI). It is required, not optional: a test
that needs it fails when it is down (`.ci/run` starts it).
"""

from __future__ import annotations

import inspect
import os
import re
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

# litellm (the judge's client) fetches its model cost map from GitHub at import unless told
# not to, as trainer/judge.py tells it; test modules that import it directly do the same
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

PG_BASE = os.environ.get("RLGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


def pytest_report_header(config: pytest.Config) -> str:
    from core.engine_protocol import SGLANG_VERSION

    where = os.environ.get("RLGATE_TEST_SGLANG_PYTHON") or "scripts/sglang_cpu_venv"
    return f"real-SGLang tier: sglang {SGLANG_VERSION} ({where})"


# The test tiers (README, "Tests"). A test is in the live tier when it, or a fixture it
# uses, or a function of the tests either calls, starts a process (an engine,
# real SGLang, a gateway process, a worker, a browser, a command), loads the real model's
# weights (an engine served in this process too: tests/servers.py in_process_engine) or
# needs PostgreSQL; the rest is the unit tier: in this process, on SQLite, in
# front of fake engines (tests/gateway/fake_engine.py). `scripts/test -m unit` runs it. A
# fixture that picks another by name (request.getfixturevalue) counts as live, except
# db_url: its parameter tells.
LIVE_FIXTURES = {
    *("pg_url", "session_pg_url", "private_pg", "engine", "sglang", "engine_url", "hf_model"),
    *("gw", "embedded_gw", "sglang_gw"),  # tests/gateway's gateways in front of real engines
}
LIVE_CALLS = re.compile(
    r"(?<![\w.])(running|gateway|sglang_server|worker|pg_gateway|sync_playwright|fit)\("
    r"|subprocess\.|Popen|\bmain\(|CliRunner|getfixturevalue|LlamaModel\(|Policy\.load\("
    r"|in_process_engine\("  # the real model's weights, in this process
    r"|_admin_conn\("  # a PostgreSQL database of its own
)
CALLED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(")
_live_source: dict[object, bool] = {}


def _starts_something(fn: object) -> bool:
    """Whether ``fn``'s source, or that of a function of the tests it calls, starts
    something (LIVE_CALLS)."""
    if fn in _live_source:
        return _live_source[fn]
    _live_source[fn] = False  # a cycle of calls adds nothing
    try:
        source = inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    scope = getattr(fn, "__globals__", {})
    callees = (scope.get(name) for name in set(CALLED.findall(source)))
    live = bool(LIVE_CALLS.search(source)) or any(
        inspect.isfunction(c) and c.__module__.startswith("tests.") and _starts_something(c)
        for c in callees
    )
    _live_source[fn] = live
    return live


def _is_live(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow") or item.get_closest_marker("live"):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "postgresql" in params.values() or LIVE_FIXTURES & set(item.fixturenames):  # type: ignore[attr-defined]
        return True
    if _starts_something(getattr(item, "function", None)):
        return True
    defs = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    return any(
        _starts_something(d.func) for name, ds in defs.items() if name != "db_url" for d in ds
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker("unit"):
            item.add_marker(pytest.mark.live if _is_live(item) else pytest.mark.unit)


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
    developer's running stacks, rlgate/stack.py) and no stray RLGATE_* settings, except a
    gateway's that serves in this process for the whole module (it reads them as it
    serves, as a gateway process would); what a command run in-process adopted from a
    stack is undone after it."""
    from core.settings import get_settings
    from rlgate import stack
    from tests.servers import IN_PROCESS_ENVS

    for name in list(os.environ):
        if name.startswith("RLGATE_") and not name.startswith("RLGATE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLGATE_DATA_DIR", str(tmp_path / "data"))
    for env in IN_PROCESS_ENVS:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
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
