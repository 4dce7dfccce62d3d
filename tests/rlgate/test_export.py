"""`rlgate export`: every exported record validates against its ATDP JSON Schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from core.migrate import upgrade
from schemas import generate
from schemas.atdp import RECORD_TYPES
from schemas.convert import to_row

ROOT = Path(generate.__file__).parent


def _load(name: str) -> dict:
    return json.loads((ROOT / "examples" / f"{name}.json").read_text())


def test_export_jsonl_validates(db_url, tmp_path, monkeypatch):
    from core.db import make_engine, session_factory

    upgrade(db_url)
    factory = session_factory(make_engine(db_url))
    with factory() as db, db.begin():
        for name in ("Project", "Session"):
            db.merge(to_row(RECORD_TYPES[name].model_validate(_load(name))))
        db.flush()
        rated = RECORD_TYPES["Interaction"].model_validate(_load("Interaction"))
        unrated = rated.model_copy(update={"id": "chatcmpl-unrated", "seq": 1, "reward": None})
        db.add(to_row(rated))
        db.add(to_row(unrated))
        db.add(to_row(RECORD_TYPES["Feedback"].model_validate(_load("Feedback"))))
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)

    def export(*args: str) -> list[dict]:
        out = tmp_path / "out.jsonl"
        r = subprocess.run(
            [sys.executable, "-m", "rlgate.cli", "export", "-o", str(out), *args],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        return [json.loads(line) for line in out.read_text().splitlines()]

    interactions = export("--project", "demo")
    assert {r["id"] for r in interactions} == {rated.id, "chatcmpl-unrated"}
    assert [r["id"] for r in export("--rated-only")] == [rated.id]
    schema = json.loads((ROOT / "json" / "Interaction.json").read_text())
    for rec in interactions:
        jsonschema.validate(rec, schema, cls=jsonschema.Draft202012Validator)
    assert interactions[0]["completion_logprobs"] == _load("Interaction")["completion_logprobs"]
    for kind, name in (("session", "Session"), ("feedback", "Feedback")):
        recs = export("--type", kind)
        schema = json.loads((ROOT / "json" / f"{name}.json").read_text())
        assert len(recs) == 1
        jsonschema.validate(recs[0], schema, cls=jsonschema.Draft202012Validator)


def test_parquet_without_pyarrow_names_this_venvs_pip(migrated_db, db_url, tmp_path, monkeypatch):
    """The hint installs pyarrow where rlgate runs (a bare `pip` is often another Python's)."""
    from click.testing import CliRunner

    from core.settings import get_settings
    from rlgate.cli import main

    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(
            main, ["export", "--format", "parquet", "-o", str(tmp_path / "x.parquet")]
        )
    finally:
        get_settings.cache_clear()
    assert out.exit_code == 2
    assert f"{sys.executable} -m pip install pyarrow" in out.output
