"""`rlgate train --once`: a run that trained but could not publish is not a success."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from core.db import transaction
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from schemas.tables import SessionRow
from tests.servers import MODEL_CACHE
from tests.trainer.helpers import make_project, render
from tests.trainer.test_hints import QUESTION, _rating, _turn


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_train_once_exits_1_when_the_adapter_is_not_published(
    migrated_db, db_url, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from core.settings import get_settings
    from rlgate.cli import main

    factory = migrated_db
    pid = make_project(factory, {"lora_rank": 4, "guards": False})
    with transaction(factory) as db:
        db.add(SessionRow(id=f"{pid}-s", project_id=pid, status="open"))
        db.flush()
        iid = _turn(db, pid, f"{pid}-s", 1, {"messages": []}, render(QUESTION))
        _rating(db, pid, "interaction", iid, source="user")
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    monkeypatch.setenv("RLGATE_ENGINE_URLS", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("RLGATE_MODEL_PATH", str(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)))
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(main, ["train", "--once", "--no-progress", "-p", pid])
    finally:
        get_settings.cache_clear()
    assert out.exit_code == 1, out.output
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["project"] == pid and line["status"] == "trained-not-published", line
