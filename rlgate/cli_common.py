"""What every `rlgate` command shares: one-line errors (exit status 2), the settings,
and the migrated database."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError, ProgrammingError

from core.settings import ENV_PREFIX, ConfigError, Settings, get_settings


def fail(message: str) -> None:
    click.echo(f"rlgate: error: {message}", err=True)
    sys.exit(2)


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn configuration and database errors into one line on stderr, exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            fail(str(e))
        except (OperationalError, ProgrammingError) as e:
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            fail(f"database error: {reason}")

    return wrapper


def load_settings() -> Settings:
    try:
        return get_settings()
    except ConfigError:
        raise
    except ValidationError as e:
        raise ConfigError(f"invalid settings: {settings_errors(e)}") from None
    except Exception as e:  # TOML errors
        raise ConfigError(f"invalid settings: {' '.join(str(e).split())}") from None


def settings_errors(e: ValidationError) -> str:
    """Each error as the variable an operator sets (``RLGATE_GATEWAY_PORT='eighty': Input
    should be a valid integer``), not pydantic's field path and help URL."""
    parts = []
    for err in e.errors(include_url=False):
        field = str(err["loc"][0]) if err["loc"] else ""
        name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
        value = f"={err['input']!r}" if not isinstance(err.get("input"), dict) else ""
        parts.append(f"{name}{value}: {err['msg']}")
    return "; ".join(parts)


def open_db():  # type: ignore[no-untyped-def]
    from core.db import check_connection, make_engine, require_existing, session_factory
    from core.migrate import current

    settings = load_settings()
    require_existing(settings.effective_database_url)
    engine = make_engine(settings.effective_database_url)
    check_connection(engine)
    if current(settings.effective_database_url) is None:
        raise ConfigError("the database is not migrated yet; run `rlgate migrate` first")
    return session_factory(engine)
