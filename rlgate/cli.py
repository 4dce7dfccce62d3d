"""The `rlgate` command line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.exc import OperationalError, ProgrammingError

from core.settings import ConfigError, Settings, get_settings
from gateway import __version__


def _fail(message: str) -> None:
    click.echo(f"rlgate: error: {message}", err=True)
    sys.exit(2)


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn configuration and database errors into one line on stderr, exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            _fail(str(e))
        except (OperationalError, ProgrammingError) as e:
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            _fail(f"database error: {reason}")

    return wrapper


def load_settings() -> Settings:
    try:
        return get_settings()
    except ConfigError:
        raise
    except Exception as e:  # pydantic ValidationError and TOML errors
        raise ConfigError(f"invalid settings: {' '.join(str(e).split())}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="TOML config file (same keys as the RLGATE_* variables, lower case, without prefix).",
)
def main(config_file: str | None) -> None:
    """rlgate: an OpenAI/Anthropic-compatible gateway that lets deployed agents learn online.

    Settings come from RLGATE_* environment variables and an optional TOML file;
    `rlgate config` shows the effective values.
    """
    if config_file:
        os.environ["RLGATE_CONFIG"] = config_file
        get_settings.cache_clear()


@main.command()
def version() -> None:
    """Print the rlgate version."""
    click.echo(f"rlgate {__version__}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@clean_errors
def config(as_json: bool) -> None:
    """Print the effective settings (secrets masked)."""
    values = load_settings().masked()
    if as_json:
        click.echo(json.dumps(values, indent=2))
        return
    width = max(len(k) for k in values)
    for key, value in values.items():
        click.echo(f"RLGATE_{key.upper():<{width}}  {value}")


@main.command()
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.option("--downgrade", "down_to", default=None, help="Downgrade to this revision instead.")
@clean_errors
def migrate(revision: str, down_to: str | None) -> None:
    """Create or upgrade the database schema (Alembic)."""
    from core import migrate as mig

    url = load_settings().effective_database_url
    if down_to:
        mig.downgrade(url, down_to)
        click.echo(f"downgraded to {down_to}")
    else:
        mig.upgrade(url, revision)
        click.echo(f"database at revision {mig.current(url)}")


@main.group()
def keys() -> None:
    """Create, list and revoke API keys."""


def _open_db():  # type: ignore[no-untyped-def]
    from core.db import check_connection, make_engine, session_factory
    from core.migrate import current

    settings = load_settings()
    engine = make_engine(settings.effective_database_url)
    check_connection(engine)
    if current(settings.effective_database_url) is None:
        raise ConfigError("the database is not migrated yet; run `rlgate migrate` first")
    return session_factory(engine)


@keys.command("create")
@click.option("--project", required=True, help="Project id (created if new).")
@click.option(
    "--kind", type=click.Choice(["admin", "agent", "feedback"]), required=True, help="Key kind."
)
@click.option("--name", default=None, help="A label for the key.")
@clean_errors
def keys_create(project: str, kind: str, name: str | None) -> None:
    """Create a key and print its secret once (only a hash is stored)."""
    from core.db import transaction
    from core.keys import create_key

    factory = _open_db()
    with transaction(factory) as db:
        row, secret = create_key(db, project, kind, name=name)
    click.echo(f"created {kind} key {row.id} for project {project}", err=True)
    click.echo("the secret is shown once; store it now:", err=True)
    click.echo(secret)


@keys.command("list")
@click.option("--project", default=None, help="Only this project.")
@click.option("--all", "show_all", is_flag=True, help="Include revoked keys.")
@clean_errors
def keys_list(project: str | None, show_all: bool) -> None:
    """List keys (never their secrets)."""
    from schemas.tables import ApiKeyRow

    factory = _open_db()
    with factory() as db:
        query = select(ApiKeyRow).order_by(ApiKeyRow.created_at)
        if project:
            query = query.where(ApiKeyRow.project_id == project)
        if not show_all:
            query = query.where(ApiKeyRow.revoked_at.is_(None))
        rows = db.scalars(query).all()
    click.echo(f"{'ID':<30} {'PROJECT':<16} {'KIND':<9} {'PREFIX':<13} {'CREATED':<20} STATUS")
    for r in rows:
        status = f"revoked {r.revoked_at:%Y-%m-%d %H:%M}" if r.revoked_at else "active"
        click.echo(
            f"{r.id:<30} {r.project_id:<16} {r.kind:<9} {r.prefix + '…':<13} "
            f"{r.created_at:%Y-%m-%d %H:%M:%S}  {status}"
        )


@keys.command("revoke")
@click.argument("key_id")
@clean_errors
def keys_revoke(key_id: str) -> None:
    """Revoke a key by id, and every key it minted (session keys from POST /v1/sessions
    or /rl/start_session); they stop working within 2 s."""
    from core.db import transaction
    from core.keys import revoke_key

    factory = _open_db()
    with transaction(factory) as db:
        row = revoke_key(db, key_id)
    if row is None:
        _fail(f"no key with id {key_id} (see `rlgate keys list --all`)")
    click.echo(f"revoked {key_id}")


@main.command()
@click.option("--minutes", type=float, default=20.0, show_default=True, help="How long to train.")
@click.option("--port", type=int, default=8100, show_default=True, help="Gateway port.")
@click.option("--engine-port", type=int, default=30100, show_default=True, help="Engine port.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Where curve.json and curve.png go (default <data dir>/demo/out).",
)
@click.option("--eval-size", type=int, default=100, show_default=True, help="Held-out questions.")
@click.option(
    "--eval-every",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds at least between held-out evaluations: the newest adapter is evaluated "
    "after a swap once this much time has passed since the last evaluation (each one "
    "takes engine time from training traffic).",
)
@click.option("--group", type=int, default=8, show_default=True, help="Answers per question (n).")
@click.option(
    "--concurrency",
    type=int,
    default=32,
    show_default=True,
    help="Requests in flight (the engine batches them).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seeds the question split and order, every request's sampling seed, and the "
    "trainer (training.seed).",
)
@click.option("--require-swap", is_flag=True, help="Exit 1 unless an adapter was swapped in.")
@clean_errors
def demo(
    minutes: float,
    port: int,
    engine_port: int,
    out: str | None,
    eval_size: int,
    eval_every: float,
    group: int,
    concurrency: int,
    seed: int,
    require_swap: bool,
) -> None:
    """Watch an agent learn arithmetic: serve, rate, train, hot-swap, evaluate.

    Runs the whole embedded stack on its own database under <data dir>/demo, which each
    run clears first (its database, adapters, spool and logs): every run starts from the
    base model.
    """
    from pathlib import Path

    from rlgate.demo import fresh_state, run_demo

    base = load_settings()
    data_dir = base.data_dir / "demo"
    fresh_state(data_dir)  # every run starts from the base model
    settings = base.model_copy(update={"data_dir": data_dir, "database_url": "", "broker_url": ""})
    # reuse the converted packaged model instead of converting it again
    models = data_dir / "models"
    if not models.exists() and (base.data_dir / "models").is_dir():
        data_dir.mkdir(parents=True, exist_ok=True)
        models.symlink_to((base.data_dir / "models").resolve())
    run_demo(
        settings,
        minutes,
        port,
        engine_port,
        Path(out) if out else data_dir / "out",
        eval_size,
        eval_every,
        group,
        concurrency,
        seed,
        require_swap,
    )


@main.command()
@click.option(
    "--type",
    "kind",
    type=click.Choice(["interaction", "session", "feedback"]),
    default="interaction",
    show_default=True,
    help="Record type to export.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    default=None,
    help="File to write (default: stdout for jsonl).",
)
@click.option("--project", default=None, help="Only this project.")
@click.option(
    "--since", type=click.DateTime(), default=None, help="Only records from then on (UTC)."
)
@click.option("--rated-only", is_flag=True, help="Only rated interactions / sessions.")
@clean_errors
def export(
    kind: str, fmt: str, output: str | None, project: str | None, since: Any, rated_only: bool
) -> None:
    """Export ATDP v1 records (one JSON object per line, or Parquet)."""
    from datetime import UTC
    from pathlib import Path

    from rlgate.export import export as run_export

    factory = _open_db()
    since_utc = since.replace(tzinfo=UTC) if since else None
    n = run_export(
        factory, kind, fmt, Path(output) if output else None, project, since_utc, rated_only
    )
    click.echo(f"exported {n} {kind} records", err=True)


@main.command()
@click.option(
    "--days",
    type=click.IntRange(min=1),
    default=None,
    help="Purge interactions older than this many days, in every project touched "
    "(default: each project's retention_days, else RLGATE_RETENTION_DAYS).",
)
@click.option("--project", default=None, help="Only this project.")
@click.option("--dry-run", is_flag=True, help="Only count what would be purged.")
@clean_errors
def retention(days: int | None, project: str | None, dry_run: bool) -> None:
    """Delete the request/response payloads and token data of old interactions.

    Ids, timing, usage and rewards are kept; purged records are never trained on. Each
    project's run is an AuditEvent (retention.purge). See docs/data-protection.md.
    """
    from trainer.retention import RetentionConfigError, purge_payloads

    settings = load_settings()
    factory = _open_db()
    try:
        results = purge_payloads(
            factory,
            default_days=settings.retention_days,
            override_days=days,
            project=project,
            dry_run=dry_run,
            actor="cli",
        )
    except RetentionConfigError as e:
        raise ConfigError(str(e)) from None
    if not results:
        _fail("no retention configured: pass --days N or set RLGATE_RETENTION_DAYS")
    verb = "would purge" if dry_run else "purged"
    for r in results:
        click.echo(
            f"{r.project_id}: {verb} {r.purged} interactions older than {r.days} days "
            f"(created before {r.cutoff:%Y-%m-%d %H:%M} UTC)"
        )


@main.command()
@click.option("--host", default=None, help="Bind address (default RLGATE_GATEWAY_HOST).")
@click.option("--port", type=int, default=None, help="Port (default RLGATE_GATEWAY_PORT).")
@clean_errors
def gateway(host: str | None, port: int | None) -> None:
    """Run the gateway (OpenAI-compatible API, recording, sessions)."""
    import uvicorn

    from gateway.app import build_gateway, create_app

    settings = load_settings()
    build_gateway(settings)  # fail fast, with one line, on a bad database or model
    host = host or settings.gateway_host
    port = port or settings.gateway_port
    click.echo(
        f"rlgate gateway on http://{host}:{port}/v1 (engines: {settings.engine_urls})", err=True
    )
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
    )


@main.command()
@click.option("--port", type=int, default=None, help="Gateway port (default RLGATE_GATEWAY_PORT).")
@click.option(
    "--engine-port", type=int, default=None, help="Engine port (default RLGATE_ENGINE_PORT)."
)
@click.option("--no-trainer", is_flag=True, help="Do not start the training worker.")
@clean_errors
def up(port: int | None, engine_port: int | None, no_trainer: bool) -> None:
    """Run the embedded default: SQLite, embedded engine, gateway, trainer. Ctrl-C stops."""
    from rlgate.up import run_up

    settings = load_settings()
    run_up(
        settings,
        port or settings.gateway_port,
        engine_port or settings.engine_port,
        trainer=not no_trainer,
    )


def _register_optional_commands() -> None:
    from engine.cli import engine_command

    main.add_command(engine_command, "engine")
    from trainer import cli as trainer_cli

    for command in (
        trainer_cli.worker_command,
        trainer_cli.train_command,
        trainer_cli.adapters_group,
    ):
        main.add_command(command)


_register_optional_commands()

if __name__ == "__main__":
    main()
