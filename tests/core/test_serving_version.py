"""core/serving_version.py: the one query for which version serves a project, on both
databases (the gateway's cached pointer, the adapter sync, the dashboard, the guards,
sample selection and publishing all read it through these functions)."""

from __future__ import annotations

from typing import Any

from core.db import transaction
from core.serving_version import adapters_in_service, serving_version, serving_versions
from schemas.atdp import PolicyStatus
from schemas.convert import to_row
from schemas.tables import ProjectRow
from tests.rows import policy_version


def _seed(factory: Any) -> None:
    with transaction(factory) as db:
        for pid in ("a", "b", "c"):
            db.add(ProjectRow(id=pid, name=pid))
        db.flush()
        versions = [
            ("a", 1, PolicyStatus.retired),
            ("a", 2, PolicyStatus.serving),
            ("a", 3, PolicyStatus.candidate),
            ("a", 4, PolicyStatus.rejected),
            # two serving rows (a switch that never finished): the highest one counts
            ("b", 1, PolicyStatus.serving),
            ("b", 2, PolicyStatus.serving),
            # c serves the base model: only a candidate
            ("c", 1, PolicyStatus.candidate),
        ]
        db.add_all([to_row(policy_version(*v)) for v in versions])


def test_serving_version_of_one_project(migrated_db: Any) -> None:
    _seed(migrated_db)
    with migrated_db() as db:
        a, b = serving_version(db, "a"), serving_version(db, "b")
        assert a is not None and (a.name, a.version) == ("a-policy-v2", 2)
        assert b is not None and b.version == 2
        assert serving_version(db, "c") is None
        assert serving_version(db, "no-such-project") is None


def test_serving_versions_of_every_project(migrated_db: Any) -> None:
    _seed(migrated_db)
    with migrated_db() as db:
        got = {pid: row.version for pid, row in serving_versions(db).items()}
    assert got == {"a": 2, "b": 2}


def test_adapters_in_service(migrated_db: Any) -> None:
    _seed(migrated_db)
    with migrated_db() as db:
        serving, out = adapters_in_service(db)
    assert serving == {
        "a-policy-v2": "/adapters/a-policy-v2",
        "b-policy-v1": "/adapters/b-policy-v1",
        "b-policy-v2": "/adapters/b-policy-v2",
    }
    assert out == {"a-policy-v1", "a-policy-v4"}  # retired and rejected; never a candidate


def test_a_version_being_served_again_is_not_out(migrated_db: Any, tmp_path: Any) -> None:
    """A rollback makes the retired version's live directory, loads it, then switches: an
    adapter sync round between the load and the switch must not unload it (issue 38: a
    round that read the old status unloaded the version a promote had just loaded)."""
    from sqlalchemy import update

    from core.live_adapters import drop_live, make_live
    from schemas.tables import PolicyVersionRow

    _seed(migrated_db)
    stored = tmp_path / "a" / "a-policy-v1"
    stored.mkdir(parents=True)
    (stored / "adapter_config.json").write_text("{}")
    with transaction(migrated_db) as db:
        db.execute(
            update(PolicyVersionRow)
            .where(PolicyVersionRow.name == "a-policy-v1")
            .values(path=str(stored))
        )
    make_live(stored)  # being served again: loaded, not switched yet
    with migrated_db() as db:
        assert adapters_in_service(db)[1] == {"a-policy-v4"}
    drop_live(stored)  # retired for good
    with migrated_db() as db:
        assert adapters_in_service(db)[1] == {"a-policy-v1", "a-policy-v4"}
