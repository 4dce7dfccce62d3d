"""PATCH /admin/api/projects/<p>/training on the real gateway app, served in-process
(SQLite and PostgreSQL): a project admin key cannot store a setting that names code or
exceeds the bounds; each refusal is a 400 whose message says what to fix, and nothing is stored.

No engine is needed for settings, so the gateway points at a closed port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.tables import AuditEventRow, ProjectRow
from tests.gateway.fake_engine import in_process_gateway
from tests.servers import free_port

URL = "/admin/api/projects/p1/training"


@pytest.fixture
def admin(db_url: str, tmp_path: Path) -> Iterator[tuple[httpx.Client, Any]]:
    """A client holding p1's project admin key, and the database's session factory."""
    upgrade(db_url)
    engine = make_engine(db_url)
    factory = session_factory(engine)
    with transaction(factory) as db:
        db.add(ProjectRow(id="p1", name="p1", created_at=utcnow(), settings={"other": 1}))
        db.add(ProjectRow(id="p2", name="p2", created_at=utcnow()))
        db.flush()
        _, key = create_key(db, "p1", "admin", name="project admin")
    closed_engine = f"http://127.0.0.1:{free_port()}"
    try:
        with (
            in_process_gateway(tmp_path / "gw", db_url, closed_engine) as gw,
            httpx.Client(
                base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as client,
        ):
            yield client, factory
    finally:
        engine.dispose()


def _stored(factory: Any) -> dict[str, Any]:
    with factory() as db:
        project = db.get(ProjectRow, "p1")
        assert project is not None
        return dict(project.settings or {})


def _refused(client: httpx.Client, body: Any, fragment: str) -> None:
    raw = body if isinstance(body, str) else json.dumps(body)
    r = client.patch(URL, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("training settings not changed:") and fragment in message, message


def test_attack_and_out_of_bounds_refused_valid_stored(
    admin: tuple[httpx.Client, Any], tmp_path: Path
) -> None:
    client, factory = admin
    marker = tmp_path / "pwned"
    before = _stored(factory)
    # the reported attack: a module:function verifier and a prompt item whose first key is
    # a shell command (pydoc.pipepager runs `sh -c <first key>`)
    attack = {
        "eval_gate": {
            "enabled": True,
            "verifier": "pydoc:pipepager",
            "prompts": [{f"touch {marker}; true": 1, "prompt": "hi"}],
        }
    }
    _refused(client, attack, "eval_gate.verifier must be the name of a registered verifier")
    attack["eval_gate"]["verifier"] = "exact_number"
    _refused(client, attack, "eval_gate.prompts[0]: unknown keys")
    _refused(
        client,
        {"eval_gate": {"enabled": True, "verifier": "os.system", "prompts": [{"prompt": "x"}]}},
        "no verifier 'os.system' is registered",
    )
    # resource exhaustion: every bound, and a valid change in the same body is not stored
    _refused(client, {"epochs": 100_000, "threshold": 5}, "epochs must be between 1 and 20")
    _refused(client, {"step_delay_s": 1e6}, "step_delay_s must be between 0 and 300")
    _refused(client, {"micro_batch_tokens": 10**9}, "micro_batch_tokens must be between")
    _refused(client, {"max_samples": 10**8}, "max_samples must be between 1 and 8192")
    _refused(client, {"epochs": 20, "max_samples": 8192}, "epochs x max_samples")
    _refused(client, '{"lr": NaN}', "lr must be between")
    many = [{"prompt": "What is 2+2?", "expected": 4}] * 1000
    _refused(client, {"eval_gate": {"enabled": True, "prompts": many}}, "at most 64")
    _refused(
        client,
        {"eval_gate": {"enabled": True, "prompts": many[:1], "max_new_tokens": 100_000}},
        "max_new_tokens must be an integer in 1..256",
    )
    _refused(
        client,
        {"eval_gate": {"enabled": True, "prompts": many[:1], "margin": 9}},
        "eval_gate.margin must be a number in 0..2",
    )
    assert _stored(factory) == before  # nothing half-written
    assert not marker.exists()
    with factory() as db:
        assert db.query(AuditEventRow).filter_by(action="training.settings").count() == 0

    # a valid gate (registered verifier) and in-bounds values are stored
    gate = {
        "enabled": True,
        "verifier": "exact_number",
        "prompts": [{"prompt": "What is 2+2?", "expected": 4}, {"input_ids": [1, 2, 3]}],
        "max_new_tokens": 16,
        "margin": 0.05,
    }
    r = client.patch(URL, json={"eval_gate": gate, "epochs": 2, "step_delay_s": 1.5})
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["eval_gate"] == gate and r.json()["effective"]["epochs"] == 2
    stored = _stored(factory)
    assert stored["training"]["eval_gate"] == gate and stored["other"] == 1
    r = client.patch(URL, json={"eval_gate": None})  # null removes the override
    assert r.status_code == 200 and "eval_gate" not in r.json()["overrides"]
    assert client.patch("/admin/api/projects/p2/training", json={"epochs": 2}).status_code == 404
