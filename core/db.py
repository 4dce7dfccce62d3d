"""Database engines and sessions for PostgreSQL (production) and SQLite (embedded)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from core.settings import ConfigError

# The database cannot be reached (down, restarting, network): serving goes on from what a
# gateway already knows (keys, sessions, the serving adapter, answers spooled to disk),
# for at most STALE_IF_DOWN_S after it last read them; anything else is a clean 503
# (gateway.edge.errors.db_down_error).
DB_DOWN = (OperationalError, InterfaceError)
STALE_IF_DOWN_S = 900.0


SUPPORTED = ("sqlite", "postgresql")


def normalize_url(url: str) -> str:
    """Check the scheme and pick the psycopg 3 driver for PostgreSQL URLs."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"database URL {url!r} is not a URL (expected sqlite:///path or postgresql://...)"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise ConfigError(
            f"database URL scheme {parsed.drivername!r} is not supported; use sqlite:///path or postgresql://user@host/db"
        )
    if backend == "postgresql" and parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def require_existing(url: str) -> None:
    """ConfigError, in one line, when ``url`` is a SQLite file that does not exist: a
    command that acts on a stack's data must not create an empty database (and its
    directory) wherever it happens to run. Other backends are checked by connecting."""
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(parsed.database)
    if not path.exists():
        raise ConfigError(
            f"no running rlgate stack found and no database at {path.resolve()}: start "
            "one with `bash scripts/up` (or `rlgate up`), or point RLGATE_DATA_DIR or "
            "RLGATE_DATABASE_URL at an existing one (nothing was created)"
        )


def make_engine(url: str, *, create_dir: bool = True) -> Engine:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:" and create_dir:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        try:
            engine = create_engine(url, connect_args={"timeout": 30})
        except NoSuchModuleError as e:
            raise ConfigError(
                f"database driver for {parsed.drivername!r} is not installed: {e}"
            ) from None
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    try:
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_size=10,
            max_overflow=20,
            connect_args={"connect_timeout": 5},
        )
    except NoSuchModuleError as e:
        raise ConfigError(
            f"database driver for {parsed.drivername!r} is not installed: {e}"
        ) from None


def check_connection(engine: Engine) -> None:
    """Raise ConfigError with one line if the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as e:
        reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e).splitlines()[0]
        where = engine.url.render_as_string(hide_password=True)
        raise ConfigError(f"cannot reach the database at {where}: {reason}") from None


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    with factory() as session, session.begin():
        yield session
