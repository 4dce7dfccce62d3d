"""The `rlgate` command line: the group, and the commands that start or set up the product
(`up`, `gateway`, `demo`, `migrate`, `config`, `version`). It registers the commands of
`rlgate/cli_keys.py` (`keys`), `rlgate/cli_data.py` (`export`, `retention`),
`trainer/cli.py` (`worker`, `train`, `adapters`) and `engine/cli.py` (`engine`).

`python -m rlgate.cli gateway` (or `python -m rlgate gateway`) starts the gateway server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from core.settings import Settings, get_settings
from rlgate import __version__
from rlgate.cli_common import clean_errors, load_settings


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="TOML config file (same keys as the RLGATE_* variables, lower case, without prefix).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Act on the stack with this data dir (as RLGATE_DATA_DIR); needed only when "
    "several `rlgate up` stacks run.",
)
@click.pass_context
def main(ctx: click.Context, config_file: str | None, data_dir: str | None) -> None:
    """rlgate: an OpenAI/Anthropic-compatible gateway that lets deployed agents learn online.

    Settings come from RLGATE_* environment variables and an optional TOML file;
    `rlgate config` shows the effective values. Commands that use the database or the
    engine act on the stack `rlgate up` runs, from any directory: the one with data in
    RLGATE_DATA_DIR (or --data-dir) if set, else the one using ./rlgate-data, else the
    only one running (rlgate/stack.py); they name it in one line on stderr.
    """
    if config_file:
        os.environ["RLGATE_CONFIG"] = config_file
    if data_dir:
        os.environ["RLGATE_DATA_DIR"] = str(Path(data_dir).expanduser().resolve())
    if ctx.invoked_subcommand not in STARTS_PROCESSES:
        from core.settings import ConfigError
        from rlgate.cli_common import fail
        from rlgate.stack import adopt

        try:
            info = adopt()
        except ConfigError as e:
            fail(str(e))
        if info is not None:
            click.echo(f"rlgate: acting on {info.describe()}", err=True)
    get_settings.cache_clear()


# commands that start processes (or touch nothing) rather than act on a running stack
STARTS_PROCESSES = {"version", "up", "gateway", "demo", "engine", "worker", None}


@main.command()
def version() -> None:
    """Print the rlgate version."""
    click.echo(f"rlgate {__version__}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@clean_errors
def config(as_json: bool) -> None:
    """Print the settings the running stack uses (secrets masked, the data dir absolute),
    each with its origin: default, file, environment or up (the stack `rlgate up` runs, or
    what `up` would set, such as the default max tokens). Exit 2 on settings that cannot
    work (a malformed value, an unsupported or malformed database URL, an unknown tool
    parser), as every command. It does not connect to the database. --json prints the
    values and, under "origins", each one's origin."""
    from core.db import normalize_url
    from core.settings import ConfigError
    from gateway.call.parsing import TOOL_PARSERS
    from rlgate.config_view import view
    from rlgate.stack import ADOPTED
    from rlgate.up import _default_cap as up_cap_env

    def up_cap(settings: Settings) -> str:
        return up_cap_env(settings).get("RLGATE_DEFAULT_MAX_TOKENS", "")

    settings = load_settings()
    normalize_url(settings.effective_database_url)  # ConfigError: one line, exit 2
    if settings.tool_parser and settings.tool_parser not in TOOL_PARSERS:  # as the gateway
        raise ConfigError(f"RLGATE_TOOL_PARSER must be one of {', '.join(TOOL_PARSERS)}")
    shown = view(settings, ADOPTED[0] if ADOPTED else None, up_cap(settings))
    if as_json:
        values: dict[str, object] = {k: v for k, (v, _) in shown.items()}
        values["origins"] = {k: o for k, (_, o) in shown.items()}
        click.echo(json.dumps(values, indent=2))
        return
    width = max(len(k) for k in shown)
    vwidth = min(40, max(len(v) for v, _ in shown.values()))
    for key, (value, origin) in shown.items():
        click.echo(f"RLGATE_{key.upper():<{width}}  {value:<{vwidth}}  ({origin})")


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


@main.command()
@click.option(
    "--task",
    type=click.Choice(["arithmetic", "tools"]),
    default="arithmetic",
    show_default=True,
    help="arithmetic: single-turn sums, every answer rated. tools: a multi-turn tool loop "
    "(three lookup tools), one rating per session at its end.",
)
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
@click.option(
    "--group",
    type=int,
    default=8,
    show_default=True,
    help="Answers per question (n), or sibling sessions per question with --task tools.",
)
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
@click.option(
    "--until-swap",
    is_flag=True,
    help="End once the first adapter is swapped in and its held-out point taken (--minutes "
    "is then the most it runs); exit 1 unless that happened. A smoke check of the loop.",
)
@clean_errors
def demo(
    task: str,
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
    until_swap: bool,
) -> None:
    """Watch an agent learn: serve, rate, train, hot-swap, evaluate.

    Runs the whole embedded stack on its own database under <data dir>/demo, which each
    run clears first (its database, adapters, spool and logs): every run starts from the
    base model.
    """
    from rlgate.demo import run_demo
    from rlgate.demo_curve import fresh_state

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
        task,
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
        until_swap,
    )


@main.command()
@click.option("--host", default=None, help="Bind address (default RLGATE_GATEWAY_HOST).")
@click.option("--port", type=int, default=None, help="Port (default RLGATE_GATEWAY_PORT).")
@clean_errors
def gateway(host: str | None, port: int | None) -> None:
    """Run the gateway (OpenAI-compatible API, recording, sessions)."""
    import uvicorn

    from core.logs import configure as configure_logging
    from gateway.app import build_gateway, create_app

    settings = load_settings()
    configure_logging(settings.log_level)  # rlgate's own loggers, as the worker's
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
@click.option(
    "--port", type=int, default=None, help="(First) gateway port (default RLGATE_GATEWAY_PORT)."
)
@click.option(
    "--engine-port",
    type=int,
    default=None,
    help="(First) engine port (default RLGATE_ENGINE_PORT).",
)
@click.option("--no-trainer", is_flag=True, help="Do not start the training worker.")
@click.option(
    "--new-keys",
    is_flag=True,
    help="Revoke the agent and admin keys kept in <data dir>/up-keys.json and mint new "
    "ones (without it, a start reuses them while they are valid).",
)
@click.option(
    "--engine",
    "engine_kind",
    type=click.Choice(["embedded", "sglang"]),
    default=None,
    help="The engine to start: the embedded CPU engine, or real SGLang started with "
    "RLGATE_SGLANG_COMMAND and RLGATE_SGLANG_ARGS (default RLGATE_ENGINE: embedded; "
    "docs/engine.md has the GPU and CPU recipes).",
)
@click.option(
    "--engines",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Engines, on consecutive ports from --engine-port.",
)
@click.option(
    "--gateways",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Gateways, on consecutive ports from --port; each routes over every engine.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Training workers (the first runs the schedule).",
)
@clean_errors
def up(
    port: int | None,
    engine_port: int | None,
    no_trainer: bool,
    new_keys: bool,
    engine_kind: str | None,
    engines: int,
    gateways: int,
    workers: int,
) -> None:
    """Run the embedded default: SQLite, an engine, gateway, trainer. Ctrl-C stops.

    The agent and admin keys it prints are kept in <data dir>/up-keys.json (mode 0600)
    and reused by the next start while valid; --new-keys replaces them. A gateway or
    engine port already in use is refused (exit 2) before anything starts. Ready-to-use
    Codex and OpenClaw configurations are written under <data dir>/clients/.

    Several gateways or workers need RLGATE_DATABASE_URL (PostgreSQL) and
    RLGATE_BROKER_URL (Redis or RabbitMQ): SQLite and the embedded broker serve one
    process only. Every gateway and worker is given every engine's URL.
    """
    from rlgate.up import Shape
    from rlgate.up_run import run_up

    settings = load_settings()
    if engine_kind:
        settings = settings.model_copy(update={"engine": engine_kind})
    run_up(
        settings,
        port or settings.gateway_port,
        engine_port or settings.engine_port,
        trainer=not no_trainer,
        shape=Shape(engines, gateways, 1 if no_trainer else workers),
        new_keys=new_keys,
    )


def _register_commands() -> None:
    from engine.cli import engine_command
    from rlgate.cli_data import export, retention
    from rlgate.cli_keys import keys

    main.add_command(keys)
    main.add_command(export)
    main.add_command(retention)
    main.add_command(engine_command, "engine")
    from trainer import cli as trainer_cli

    for command in (
        trainer_cli.worker_command,
        trainer_cli.train_command,
        trainer_cli.adapters_group,
    ):
        main.add_command(command)
    # the trainer's commands report settings and database errors as every other does
    for command in (trainer_cli.train_command, *trainer_cli.adapters_group.commands.values()):
        command.callback = clean_errors(command.callback)


_register_commands()

if __name__ == "__main__":
    main()
