"""`rlgate adapters rollback|promote base` (issue 38, item 3): the base model is a version
on the command line too. The switch answers at once (``unload=False``: nothing waits for
the engines; the replaced version's live directory is removed and the gateways' adapter
sync unloads it), is audited as the base model, and the same refusals hold. No engine is
needed for a switch to the base model: nothing is loaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from core.db import transaction
from core.live_adapters import live_path, make_live
from core.settings import get_settings
from schemas.atdp import PolicyStatus
from schemas.convert import to_row
from schemas.tables import AuditEventRow, PolicyVersionRow, ProjectRow
from tests.rows import policy_version


@pytest.fixture
def cli_env(migrated_db: Any, db_url: str, tmp_path: Any, monkeypatch: Any) -> Iterator[Any]:
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    monkeypatch.setenv("RLGATE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RLGATE_ENGINE_URLS", "http://127.0.0.1:9")  # never reached
    get_settings.cache_clear()
    stored = tmp_path / "adapters" / "p1" / "p1-policy-v1"
    stored.mkdir(parents=True)
    (stored / "adapter_config.json").write_text("{}")
    with transaction(migrated_db) as db:
        db.add(ProjectRow(id="p1", name="p1"))
        db.flush()
        db.add(to_row(policy_version("p1", 1, PolicyStatus.serving, path=str(stored))))
        db.add(to_row(policy_version("p1", 2, PolicyStatus.rejected)))
    make_live(stored)
    yield stored
    get_settings.cache_clear()


def test_rollback_to_base_and_what_is_refused(migrated_db: Any, cli_env: Any) -> None:
    from rlgate.cli import main

    runner = CliRunner()
    out = runner.invoke(main, ["adapters", "rollback", "-p", "p1", "base"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {
        "name": "base",
        "previous": "p1-policy-v1",
        "changed": True,
        "unloading": "p1-policy-v1",
    }
    assert not live_path(cli_env).exists()  # no engine can re-load it on demand
    with migrated_db() as db:
        statuses = dict(db.execute(select(PolicyVersionRow.name, PolicyVersionRow.status)).all())
        event = db.scalars(select(AuditEventRow)).one()
    assert statuses == {"p1-policy-v1": "retired", "p1-policy-v2": "rejected"}
    assert (event.action, event.actor) == ("adapter.rollback", "cli")
    assert (event.target_type, event.target_id) == ("base_model", "base")
    assert event.details["previous"] == "p1-policy-v1"

    again = runner.invoke(main, ["adapters", "promote", "-p", "p1", "Base"])
    assert again.exit_code == 0 and json.loads(again.output)["changed"] is False
    rejected = runner.invoke(main, ["adapters", "promote", "-p", "p1", "2"])
    assert rejected.exit_code == 2 and "rejected by the eval gate" in rejected.output
    unknown = runner.invoke(main, ["adapters", "rollback", "-p", "p1", "v9"])
    assert unknown.exit_code == 2 and "'base' for the base model" in unknown.output
    nowhere = runner.invoke(main, ["adapters", "rollback", "-p", "nope", "base"])
    assert nowhere.exit_code == 2 and "no project 'nope'" in nowhere.output
    with migrated_db() as db:
        assert len(db.scalars(select(AuditEventRow)).all()) == 1  # the refusals changed nothing


def test_rollback_without_a_target_serves_what_served_before(
    migrated_db: Any, cli_env: Any
) -> None:
    """No TARGET: what served before the current version, as the admin API does (after
    the first version: the base model); then nothing is left to roll back from."""
    from rlgate.cli import main

    runner = CliRunner()
    out = runner.invoke(main, ["adapters", "rollback", "-p", "p1"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["name"] == "base"
    again = runner.invoke(main, ["adapters", "rollback", "-p", "p1"])
    assert again.exit_code == 2
    assert "already serves the base model" in again.output


def test_commands_never_create_a_database_where_they_run(tmp_path: Any, monkeypatch: Any) -> None:
    """Run where no stack's data is: one line that says where it looked and what to do,
    exit 2, and nothing created (it once made ./rlgate-data/rlgate.db and died with a
    traceback)."""
    from rlgate.cli import main

    monkeypatch.delenv("RLGATE_DATABASE_URL", raising=False)
    monkeypatch.setenv("RLGATE_DATA_DIR", str(tmp_path / "rlgate-data"))
    get_settings.cache_clear()
    try:
        for argv in (
            ["adapters", "list"],
            ["adapters", "rollback"],
            ["adapters", "promote", "2"],
            ["train", "--once"],
            ["keys", "list"],
            ["export", "-o", str(tmp_path / "out.jsonl")],
        ):
            out = CliRunner().invoke(main, argv)
            assert out.exit_code == 2, (argv, out.output)
            lines = [line for line in out.output.splitlines() if line.strip()]
            assert len(lines) == 1 and "no database at" in lines[0], (argv, out.output)
            assert "RLGATE_DATA_DIR" in lines[0] and "Traceback" not in out.output
    finally:
        get_settings.cache_clear()
    assert list(tmp_path.iterdir()) == []
