"""A rollback during a long generation on the embedded engine (issue 38, items 3 and 4): a
rollback to the base model through the admin API answers while the generation on the
serving version v1 still streams, new calls go to the base model at once (no adapter),
and v1 stays loaded in the engine until that generation ends, then is unloaded
(gateway/engines/unloads.py, after the gateway's lease on it:
gateway/engines/adapter_leases.py). One adapter slot only: the session's engine keeps the
contract tests' adapters loaded.

The long generation: structured output whose schema cannot end before 60 numbers, so
the answer runs for well over a hundred tokens whatever the model would rather write
(the rollback answers in well under a second, about 5 tokens in).
"""

from __future__ import annotations

import json
import secrets
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from core.db import transaction
from core.engine_http import EngineHTTP
from core.settings import Settings
from schemas.tables import AuditEventRow, InteractionRow, PolicyVersionRow
from tests.faults.helpers import setup_db, wait_rows
from tests.gateway.fake_engine import in_process_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROJECT = "inflight"
ADMIN = "rlg_admin_" + secrets.token_urlsafe(24)
LONG = {
    "type": "json_schema",
    "json_schema": {
        "name": "numbers",
        "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 60},
    },
}


def _candidate(factory, root: Path, src: Path, version: int) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    name = f"{PROJECT}-v{version}"
    path = root / PROJECT / name
    shutil.copytree(src, path)
    vid = f"pv-{PROJECT}-{version}"
    with transaction(factory) as db:
        db.add(
            PolicyVersionRow(
                id=vid,
                project_id=PROJECT,
                name=name,
                version=version,
                base_model="packaged",
                path=str(path),
                lora_config={},
                status="candidate",
            )
        )
    return vid, name


def test_rollback_during_a_long_generation(  # type: ignore[no-untyped-def]
    engine_url, adapter_dirs, sqlite_url, tmp_path
) -> None:
    from trainer import serving_switch

    factory, (key,) = setup_db(sqlite_url, project=PROJECT)
    settings = Settings(database_url=sqlite_url, engine_urls=engine_url, data_dir=tmp_path / "d")
    v1, name1 = _candidate(factory, tmp_path / "adapters", adapter_dirs["a"], 1)
    assert serving_switch.publish_version(factory, settings, v1)  # v1 serves
    engine = EngineHTTP(engine_url, {}, 60)
    agent = {"Authorization": f"Bearer {key}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with in_process_gateway(tmp_path / "gw", sqlite_url, engine_url, admin_key=ADMIN) as gw:
        lines: list[str] = []
        served: dict[str, str] = {}
        ended = threading.Event()

        def long_call() -> None:
            body = {
                "messages": [{"role": "user", "content": "List numbers."}],
                "max_tokens": 800,
                "stream": True,
                "response_format": LONG,
            }
            with (
                httpx.Client(timeout=300) as c,
                c.stream("POST", f"{gw.url}/v1/chat/completions", headers=agent, json=body) as r,
            ):
                served["version"] = r.headers.get("x-rlgate-policy-version", "")
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        lines.append(line)
            ended.set()

        thread = threading.Thread(target=long_call)
        thread.start()
        deadline = time.monotonic() + 240
        while len(lines) < 5:  # generating on v1
            assert time.monotonic() < deadline and not ended.is_set(), "no tokens streamed"
            time.sleep(0.05)
        t0 = time.monotonic()
        with httpx.Client(timeout=120) as c:
            r = c.post(
                f"{gw.url}/admin/api/actions/rollback",
                headers=admin,
                json={"project_id": PROJECT, "target": "base"},
            )
            took = time.monotonic() - t0
            streamed = len(lines)
            print(f"rollback answered in {took:.3f} s, {streamed} chunks into the generation")
            assert r.status_code == 200, r.text
            pending = c.get(f"{gw.url}/admin/api/unloads", headers=admin).json()["items"]
            present = name1 in engine.adapters()
            # all read while the generation still ran
            assert not ended.is_set(), "the generation ended before the rollback answered"
            out = r.json()
            assert (out["name"], out["previous"]) == ("base", name1)
            assert out["unload"]["name"] == name1 and out["unload"]["in_flight"] == 1
            assert [(u["name"], u["in_flight"]) for u in pending] == [(name1, 1)]
            assert present  # still loaded: its generation runs
            # a new call is served by the base model at once
            now = c.post(
                f"{gw.url}/v1/chat/completions",
                headers=agent,
                json={"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2},
            )
            assert now.status_code == 200 and now.headers["x-rlgate-policy-version"] == "base"
        # while the generation runs, v1 stays loaded (read the engine first: a generation
        # not ended after the read was running during it)
        while True:
            present = name1 in engine.adapters()
            if ended.is_set():
                break
            assert present, "v1 was unloaded while its generation ran"
            time.sleep(0.2)
        thread.join(300)
        assert ended.is_set() and len(lines) > streamed
        deadline = time.monotonic() + 60
        while name1 in engine.adapters():
            assert time.monotonic() < deadline, "v1 was not unloaded after its generation"
            time.sleep(0.1)
    assert served["version"] == name1
    first = json.loads(lines[0][6:])["id"]
    wait_rows(factory, {first}, timeout=60)
    with factory() as db:
        assert (
            db.scalar(select(InteractionRow.policy_version).where(InteractionRow.id == first))
            == name1
        )
        note = db.scalars(
            select(AuditEventRow).where(AuditEventRow.action == "adapter.unload")
        ).one()
    assert note.target_id == v1 and note.details["forced"] is False
    engine.client.close()
