"""Retention (trainer/retention.py) on SQLite and PostgreSQL, with backdated rows: old
payloads are purged in bounded batches, recent ones kept, a second run changes nothing,
each run is audited, purged records are never trained on, and the CLI and the Celery
task do the same."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

from core.db import transaction
from core.keys import ensure_project
from schemas.atdp import Interaction
from schemas.convert import to_record, to_row
from schemas.tables import AuditEventRow, ConversationItemRow, ConversationRow, InteractionRow
from tests.rows import T0, interaction, session
from trainer.data import REDACTION_MARKER
from trainer.retention import (
    RetentionConfigError,
    purge_payloads,
)
from trainer.triggers import count_signal

SECRET = "the-old-secret-payload"


def seed(factory, project: str, old: int, recent: int, settings: dict | None = None) -> None:  # type: ignore[no-untyped-def]
    with transaction(factory) as db:
        ensure_project(db, project).settings = settings or {}
        db.add(to_row(session(f"s-{project}", project)))
        db.flush()
        for i in range(old + recent):
            at = T0 - timedelta(days=40) if i < old else T0 - timedelta(days=1)
            rec = interaction(
                f"{project}-{i}",
                f"s-{project}",
                i,
                SECRET,
                project_id=project,
                question=SECRET,
                start=at,
                reward=1.0,
            )
            db.add(to_row(rec))


def rows(factory, project: str) -> dict[str, Interaction]:  # type: ignore[no-untyped-def]
    with factory() as db:
        q = select(InteractionRow).where(InteractionRow.project_id == project)
        return {r.id: to_record(r) for r in db.scalars(q)}


def audits(factory, action: str = "retention.purge") -> list[AuditEventRow]:  # type: ignore[no-untyped-def]
    with factory() as db:
        q = select(AuditEventRow).where(AuditEventRow.action == action)
        return list(db.scalars(q.order_by(AuditEventRow.created_at)))


def test_purges_old_payloads_in_batches_idempotently(migrated_db):
    seed(migrated_db, "p1", old=5, recent=2)
    with migrated_db() as db:
        assert count_signal(db, "p1", 10) == 7
    dry = purge_payloads(migrated_db, default_days=30, now=T0, dry_run=True)
    assert [(r.project_id, r.purged, r.dry_run) for r in dry] == [("p1", 5, True)]
    assert all(SECRET in r.output.text for r in rows(migrated_db, "p1").values())

    (res,) = purge_payloads(migrated_db, default_days=30, now=T0, batch_size=2)
    assert res.purged == 5 and res.complete and res.days == 30
    got = rows(migrated_db, "p1")  # every row still converts to a valid ATDP record
    for i in range(5):
        rec = got[f"p1-{i}"]
        assert rec.output.text is None and rec.request[REDACTION_MARKER]["redacted"] is True
        assert list(rec.request) == [REDACTION_MARKER]
        assert rec.prompt_token_ids == rec.completion_token_ids == rec.completion_logprobs == []
        assert rec.reward == 1.0 and rec.usage.prompt_tokens == 1  # metadata kept
    for i in (5, 6):
        assert got[f"p1-{i}"].output.text == SECRET and got[f"p1-{i}"].prompt_token_ids == [1]
    with migrated_db() as db:
        raw = db.execute(text("SELECT request, output FROM interactions")).all()
        assert sum(SECRET in f"{r[0]} {r[1]}" for r in raw) == 2
        assert count_signal(db, "p1", 10) == 2  # purged records are never trained on

    (again,) = purge_payloads(migrated_db, default_days=30, now=T0)
    assert again.purged == 0
    assert rows(migrated_db, "p1") == got
    events = audits(migrated_db)
    assert [(e.project_id, e.actor, e.details["purged"]) for e in events] == [
        ("p1", "system", 5),
        ("p1", "system", 5),
        ("p1", "system", 0),
    ]
    assert events[0].details["dry_run"] is True and events[1].details["days"] == 30


def test_max_rows_bounds_a_run_and_the_next_continues(migrated_db):
    seed(migrated_db, "p1", old=5, recent=0)
    (first,) = purge_payloads(migrated_db, default_days=30, now=T0, batch_size=2, max_rows=3)
    assert (first.purged, first.complete) == (3, False)
    (second,) = purge_payloads(migrated_db, default_days=30, now=T0, max_rows=3)
    assert (second.purged, second.complete) == (2, True)


def test_project_setting_overrides_the_deployment(migrated_db, caplog):
    seed(migrated_db, "keep", old=2, recent=0)
    seed(migrated_db, "short", old=2, recent=1, settings={"retention_days": 7})
    seed(migrated_db, "broken", old=1, recent=0, settings={"retention_days": "soon"})
    results = purge_payloads(migrated_db, default_days=None, now=T0)
    assert [(r.project_id, r.purged) for r in results] == [("short", 2)]
    assert "retention_days" in caplog.text and "broken" in caplog.text
    assert all(r.output.text == SECRET for r in rows(migrated_db, "keep").values())
    with pytest.raises(RetentionConfigError, match="whole number of days"):
        purge_payloads(migrated_db, default_days=None, project="broken")
    results = purge_payloads(migrated_db, default_days=None, override_days=30, now=T0)
    assert {r.project_id: r.purged for r in results} == {"broken": 1, "keep": 2, "short": 0}


def test_cli(migrated_db, db_url, monkeypatch):
    from rlgate.cli import main

    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    seed(migrated_db, "p1", old=2, recent=1)
    runner = CliRunner()
    none = runner.invoke(main, ["retention"])
    assert none.exit_code == 2 and "pass --days N" in none.output
    dry = runner.invoke(main, ["retention", "--days", "30", "--dry-run"])
    assert dry.exit_code == 0 and "p1: would purge 2 interactions" in dry.output
    done = runner.invoke(main, ["retention", "--days", "30", "--project", "p1"])
    assert done.exit_code == 0 and "p1: purged 2 interactions" in done.output
    assert runner.invoke(main, ["retention", "--days", "0"]).exit_code == 2
    missing = runner.invoke(main, ["retention", "--days", "3", "--project", "nope"])
    assert missing.exit_code == 2 and "no project 'nope'" in missing.output
    assert [e.actor for e in audits(migrated_db)] == ["cli", "cli"]


def test_celery_task_uses_the_settings(migrated_db, db_url, monkeypatch):
    from trainer.celery_app import app

    assert app.conf.beat_schedule["rlgate-retention"]["task"] == "rlgate.retention"
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    monkeypatch.setenv("RLGATE_RETENTION_DAYS", "30")
    from core.settings import get_settings

    get_settings.cache_clear()
    seed(migrated_db, "p1", old=1, recent=1)
    out = app.tasks["rlgate.retention"].apply().get()
    assert [(r["project_id"], r["purged"]) for r in out] == [("p1", 1)]
    json.dumps(out)  # a JSON-serializable task result
    assert [e.actor for e in audits(migrated_db)] == ["system"]


def test_old_conversation_items_are_deleted(migrated_db):
    seed(migrated_db, "p1", old=0, recent=0)
    seed(migrated_db, "p2", old=0, recent=0)
    with transaction(migrated_db) as db:
        for project in ("p1", "p2"):
            db.add(ConversationRow(id=f"conv_{project}", project_id=project, meta={}))
            db.flush()
            for i, at in enumerate((T0 - timedelta(days=40), T0 - timedelta(days=1))):
                item = {"type": "message", "id": f"msg_{project}{i}", "content": SECRET}
                db.add(
                    ConversationItemRow(
                        id=f"msg_{project}{i}",
                        conversation_id=f"conv_{project}",
                        item=item,
                        created_at=at,
                    )
                )
    (dry,) = purge_payloads(migrated_db, default_days=30, now=T0, project="p1", dry_run=True)
    assert dry.conversation_items == 1
    (res,) = purge_payloads(migrated_db, default_days=30, now=T0, project="p1")
    assert res.conversation_items == 1
    with migrated_db() as db:
        left = db.scalars(select(ConversationItemRow.id).order_by(ConversationItemRow.id)).all()
    assert left == ["msg_p11", "msg_p20", "msg_p21"]  # p1's recent one, all of p2's
    assert audits(migrated_db)[-1].details["conversation_items"] == 1
