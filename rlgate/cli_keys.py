"""`rlgate keys create / list / revoke`: API keys (only a hash is stored)."""

from __future__ import annotations

import click
from sqlalchemy import select

from rlgate.cli_common import clean_errors, fail, open_db


@click.group("keys")
def keys() -> None:
    """Create, list and revoke API keys."""


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

    factory = open_db()
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

    factory = open_db()
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

    factory = open_db()
    with transaction(factory) as db:
        row = revoke_key(db, key_id)
    if row is None:
        fail(f"no key with id {key_id} (see `rlgate keys list --all`)")
    click.echo(f"revoked {key_id}")
