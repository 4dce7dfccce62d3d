"""Run Alembic migrations programmatically (`rlgate migrate`, `rlgate up`, the gateway's
start-up check, and the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from core.db import check_connection, make_engine, normalize_url

SCRIPT_LOCATION = Path(next(iter(migrations.__path__)))


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    engine = make_engine(url)
    check_connection(engine)
    engine.dispose()
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    engine = make_engine(url)
    check_connection(engine)
    engine.dispose()
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    check_connection(engine)
    with engine.connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
    engine.dispose()
    return rev
