"""`rlgate export` (ATDP v1 records out) and `rlgate retention` (old payloads deleted)."""

from __future__ import annotations

from typing import Any

import click

from core.settings import ConfigError
from rlgate.cli_common import clean_errors, fail, load_settings, open_db


@click.command("export")
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
@click.option(
    "--until", type=click.DateTime(), default=None, help="Only records before then (UTC)."
)
@click.option("--rated-only", is_flag=True, help="Only rated interactions / sessions.")
@click.option(
    "--as",
    "shape",
    type=click.Choice(["sft", "preference", "kto"]),
    default=None,
    help="Interactions as TRL rows (jsonl): sft = chat messages with tool calls; "
    "preference = prompt/chosen/rejected from rated answers to the same prompt (siblings, "
    "or other sessions); kto = prompt/completion/"
    "label (label: reward > 0).",
)
@click.option("--policy-version", default=None, help="Only interactions of this policy version.")
@click.option("--min-reward", type=float, default=None, help="Only interactions rated >= this.")
@clean_errors
def export(
    kind: str,
    fmt: str,
    output: str | None,
    project: str | None,
    since: Any,
    until: Any,
    rated_only: bool,
    shape: str | None,
    policy_version: str | None,
    min_reward: float | None,
) -> None:
    """Export ATDP v1 records (one JSON object per line, or Parquet), or TRL rows (--as)."""
    from datetime import UTC
    from pathlib import Path

    from rlgate.export import export as run_export

    factory = open_db()
    since_utc = since.replace(tzinfo=UTC) if since else None
    until_utc = until.replace(tzinfo=UTC) if until else None
    n = run_export(
        factory,
        kind,
        fmt,
        Path(output) if output else None,
        project,
        since_utc,
        rated_only,
        shape,
        until_utc,
        policy_version,
        min_reward,
    )
    click.echo(f"exported {n} {shape + ' rows' if shape else kind + ' records'}", err=True)


@click.command("retention")
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
    factory = open_db()
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
        fail("no retention configured: pass --days N or set RLGATE_RETENTION_DAYS")
    verb = "would purge" if dry_run else "purged"
    for r in results:
        click.echo(
            f"{r.project_id}: {verb} {r.purged} interactions older than {r.days} days "
            f"(created before {r.cutoff:%Y-%m-%d %H:%M} UTC)"
        )
