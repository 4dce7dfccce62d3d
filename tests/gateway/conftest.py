"""Gateway test fixtures: one embedded engine (real packaged model) per test session and
one gateway process per database backend (SQLite file and a fresh PostgreSQL database):
``stack``, the live tier. ``fake_stack`` is the unit tier's: the same gateway app served
in-process on SQLite, in front of a scripted fake engine (tests/gateway/fake_engine.py),
for what needs neither a real model's tokens nor PostgreSQL (translation, validation, error
formats, stream shapes). A module can hold both tiers: a test names the one it runs on."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import psycopg
import pytest
from psycopg import sql

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.conftest import PG_BASE
from tests.servers import Proc, engine_cmd, free_port, gateway, packaged_model_dir, running

ENGINE_CONTEXT = 2048


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return packaged_model_dir()


@pytest.fixture(scope="session")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(
        port,
        "--context-length",
        str(ENGINE_CONTEXT),
        "--max-running-requests",
        "8",
        "--max-lora-rank",
        "16",
    )
    with running(cmd, {}, log, port) as p:
        yield p


@pytest.fixture(scope="session")
def session_pg_url() -> Iterator[str]:
    name = f"rlgate_gw_{secrets.token_hex(5)}"
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield f"{PG_BASE}/{name}"
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@dataclass
class Stack:
    gw: Proc
    engine: Proc
    db_url: str
    factory: object
    data_dir: Path

    def key(self, kind: str = "agent", project: str = "p1") -> str:
        with transaction(self.factory) as db:
            _, secret = create_key(db, project, kind)
        return secret

    def client(self, key: str | None = None, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.gw.url + "/v1",
            api_key=key or self.key(),
            max_retries=0,
            timeout=120,
            **kw,
        )


@pytest.fixture(scope="module")
def fake_stack(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A ``Stack`` of the unit tier: the gateway app in-process on a fresh SQLite file, in
    front of a FakeEngine (each /generate answers the same short text unless the test
    scripts its next answers: ``fake_stack.engine.script(...)``), one per module."""
    data_dir = tmp_path_factory.mktemp("gw-fake")
    yield from _fake_stack(data_dir, f"sqlite:///{data_dir / 'rlgate.db'}")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fake_db_stack(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``fake_stack`` on each database (a fresh SQLite file, the session's PostgreSQL
    database): for what the database decides (keys, sessions, records) but no real
    model's tokens do. The gateway app in-process, in front of a FakeEngine, one per
    module and backend."""
    data_dir = tmp_path_factory.mktemp(f"gw-fake-{request.param}")
    if request.param == "sqlite":
        db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    else:
        db_url = request.getfixturevalue("session_pg_url")
    yield from _fake_stack(data_dir, db_url)


def _fake_stack(data_dir: Path, db_url: str) -> Iterator[Stack]:
    """The gateway app in-process on ``db_url`` (migrated here), in front of a FakeEngine."""
    from tests.gateway.fake_engine import FakeEngine, in_process_gateway, serving

    upgrade(db_url)
    db_engine = make_engine(db_url)
    fake = FakeEngine()
    with serving(fake.app()) as engine_url:
        fake.url = engine_url
        with in_process_gateway(data_dir, db_url, engine_url) as gw:
            yield Stack(gw, fake, db_url, session_factory(db_engine), data_dir)  # type: ignore[arg-type]
    db_engine.dispose()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def stack(request, engine: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp(f"gw-{request.param}")
    if request.param == "sqlite":
        db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    else:
        db_url = request.getfixturevalue("session_pg_url")
    upgrade(db_url)
    db_engine = make_engine(db_url)
    with gateway(data_dir, db_url, engine.url) as gw:
        yield Stack(gw, engine, db_url, session_factory(db_engine), data_dir)
    db_engine.dispose()
