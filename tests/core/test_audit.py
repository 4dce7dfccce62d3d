"""Every export, deletion, key change, promotion and rollback leaves an AuditEvent with
its actor, project and details (SQLite and PostgreSQL).

Key changes are checked through the CLI and through the functions the dashboard / admin
API routes call (``gateway.admin.actions``); promotion and rollback through
``trainer.publish.switch_serving``, which the CLI, the dashboard and the trainer's own
publish all go through; deletion is the retention job (the only code that deletes
recorded content; the admin API and dashboard have no delete routes).
"""

from __future__ import annotations

from datetime import timedelta

from click.testing import CliRunner
from sqlalchemy import select

from core.db import transaction
from core.keys import ensure_project
from gateway.admin import actions as admin_actions
from rlgate.cli import main
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import ApiKeyRow, AuditEventRow, PolicyVersionRow
from tests.rows import interaction, session
from trainer.publish import switch_serving
from trainer.retention import purge_payloads


def events(factory, action: str) -> list[AuditEventRow]:  # type: ignore[no-untyped-def]
    with factory() as db:
        q = select(AuditEventRow).where(AuditEventRow.action == action)
        return list(db.scalars(q.order_by(AuditEventRow.created_at)))


def test_cli_key_create_revoke_and_export(migrated_db, db_url, monkeypatch, tmp_path):
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    cli = CliRunner()
    made = cli.invoke(
        main, ["keys", "create", "--project", "p1", "--kind", "agent", "--name", "ci"]
    )
    assert made.exit_code == 0, made.output
    with migrated_db() as db:
        key_id = db.scalars(select(ApiKeyRow.id)).one()
    (created,) = events(migrated_db, "key.create")
    assert (created.actor, created.project_id, created.target_id) == ("cli", "p1", key_id)
    assert created.details["kind"] == "agent" and created.details["name"] == "ci"

    assert cli.invoke(main, ["keys", "revoke", key_id]).exit_code == 0
    (revoked,) = events(migrated_db, "key.revoke")
    assert (revoked.actor, revoked.project_id, revoked.target_id) == ("cli", "p1", key_id)

    with transaction(migrated_db) as db:
        db.add(to_row(session("s1")))
        db.flush()
        db.add(to_row(interaction("i1", "s1", 0)))
    out = tmp_path / "out.jsonl"
    done = cli.invoke(main, ["export", "--project", "p1", "-o", str(out)])
    assert done.exit_code == 0, done.output
    (exported,) = events(migrated_db, "export")
    assert (exported.actor, exported.project_id, exported.target_type) == (
        "cli",
        "p1",
        "interaction",
    )
    assert exported.details["records"] == 1 and exported.details["output"] == str(out)


def test_admin_key_create_and_revoke(migrated_db):
    with transaction(migrated_db) as db:
        ensure_project(db, "p1")
    made = admin_actions.new_key(migrated_db, "p1", "feedback", "rater", "key_admin1")
    admin_actions.drop_key(migrated_db, made["id"], "key_admin1", ["p1"])
    (created,) = events(migrated_db, "key.create")
    (revoked,) = events(migrated_db, "key.revoke")
    for e in (created, revoked):
        assert (e.actor, e.project_id, e.target_id) == ("key_admin1", "p1", made["id"])
    assert created.details["kind"] == "feedback"


def _version(db, n: int) -> PolicyVersionRow:  # type: ignore[no-untyped-def]
    row = PolicyVersionRow(
        id=f"pv{n}",
        project_id="p1",
        name=f"policy-v{n}",
        version=n,
        base_model="m",
        path=f"/adapters/v{n}",
        lora_config={"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]},
        status="candidate",
        created_at=utcnow(),
    )
    db.add(row)
    return row


def test_promote_and_rollback(migrated_db):
    with transaction(migrated_db) as db:
        ensure_project(db, "p1")
        _version(db, 1)
        _version(db, 2)
    switch_serving(migrated_db, "p1", "pv1", actor="cli", action="adapter.promote")
    switch_serving(migrated_db, "p1", "pv2", actor="key_admin1", action="adapter.promote")
    switch_serving(migrated_db, "p1", "pv1", actor="key_admin1", action="adapter.rollback")
    promoted = events(migrated_db, "adapter.promote")
    assert [(e.actor, e.project_id, e.target_id) for e in promoted] == [
        ("cli", "p1", "pv1"),
        ("key_admin1", "p1", "pv2"),
    ]
    assert promoted[1].details["name"] == "policy-v2"
    assert promoted[1].details["previous"] == "policy-v1"
    (rolled,) = events(migrated_db, "adapter.rollback")
    assert (rolled.actor, rolled.project_id, rolled.target_id) == ("key_admin1", "p1", "pv1")
    assert rolled.details["previous"] == "policy-v2"


def test_deletion_by_retention(migrated_db):
    old = utcnow() - timedelta(days=10)
    with transaction(migrated_db) as db:
        ensure_project(db, "p1")
        db.add(to_row(session("s1", at=old)))
        db.flush()
        db.add(to_row(interaction("i1", "s1", 0, start=old)))
    purge_payloads(migrated_db, default_days=None, override_days=5, actor="cli")
    (deleted,) = events(migrated_db, "retention.purge")
    assert (deleted.actor, deleted.project_id) == ("cli", "p1")
    assert deleted.details["purged"] == 1 and deleted.details["days"] == 5
