"""Publish, rollback, adapter sync and seeds through rlgate's own code, on both engines
(the embedded engine and real SGLang: the ``target`` fixture).

The retired-version test is the acceptance test of issue 27: SGLang re-loads an unloaded
adapter on demand, so after a publish or a rollback a gateway whose serving cache is
stale (``RLGATE_SERVING_CACHE_S=3600``) would be served by the retired version unless the
engine cannot re-load it. rlgate loads each version from a live directory that the
trainer removes before unloading (core/live_adapters.py); the engine refuses the retired
name, and the gateway re-reads the serving version and retries once on it. The recorded
``policy_version`` is the version that sampled, and retired versions do not stay loaded.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from core.db import transaction
from core.engine_http import EngineHTTP
from core.live_adapters import live_path
from core.settings import Settings
from schemas.tables import InteractionRow, PolicyVersionRow
from tests.engine.conftest import Target
from tests.faults.helpers import setup_db, wait_rows
from tests.gateway.fake_engine import in_process_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROJECT = "engines"


def _settings(target: Target, db_url: str, data: Path) -> Settings:
    return Settings(
        database_url=db_url,
        engine_urls=target.url,
        engine_api_key=target.api_key,
        data_dir=data,
    )


def _candidate(factory, root: Path, src: Path, version: int) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A trained candidate as the runner stores it; returns (id, name)."""
    name = f"{PROJECT}-{root.name}-v{version}"
    path = root / PROJECT / name
    shutil.copytree(src, path)
    vid = f"pv-{root.name}-{version}"
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


def _chat(c: httpx.Client, url: str, key: str, text: str, stream: bool = False) -> tuple[str, str]:
    """(the policy version the gateway says served it, the call's id)."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": stream}
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        r = c.post(f"{url}/v1/chat/completions", headers=headers, json=body)
        assert r.status_code == 200, r.text
        return r.headers["x-rlgate-policy-version"], r.json()["id"]
    with c.stream("POST", f"{url}/v1/chat/completions", headers=headers, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        version = r.headers["x-rlgate-policy-version"]
    import json

    return version, json.loads(lines[0][6:])["id"]


def _recorded(factory, ids: list[str]) -> dict[str, str]:  # type: ignore[no-untyped-def]
    wait_rows(factory, set(ids), timeout=60)
    with factory() as db:
        rows = db.execute(
            select(InteractionRow.id, InteractionRow.policy_version).where(
                InteractionRow.id.in_(ids)
            )
        ).all()
    return dict(rows)


def test_retired_versions_never_serve(target: Target, sqlite_url, tmp_path, adapter_dirs) -> None:  # type: ignore[no-untyped-def]
    from trainer import serving_switch

    factory, (key,) = setup_db(sqlite_url, project=PROJECT)
    root = tmp_path / target.kind
    settings = _settings(target, sqlite_url, tmp_path / "data")
    v1, name1 = _candidate(factory, root, adapter_dirs["a"], 1)
    v2, name2 = _candidate(factory, root, adapter_dirs["b"], 2)
    assert serving_switch.publish_version(factory, settings, v1)
    engine = EngineHTTP(target.url, target.headers, 120)
    kw = {"engine_api_key": target.api_key or ""}
    with (
        in_process_gateway(tmp_path / "gw-a", sqlite_url, target.url, **kw) as fresh,
        in_process_gateway(
            tmp_path / "gw-b", sqlite_url, target.url, serving_cache_s="3600", **kw
        ) as stale,
        httpx.Client(timeout=120) as c,
    ):
        assert _chat(c, stale.url, key, "Hi.")[0] == name1  # the stale gateway caches v1
        assert _chat(c, fresh.url, key, "Hi.")[0] == name1
        # publish v2: v1 is retired; the stale gateway still names v1
        assert serving_switch.publish_version(factory, settings, v2)
        assert not live_path(root / PROJECT / name1).exists()
        served = [_chat(c, stale.url, key, f"Say {i}.") for i in range(2)]
        served.append(_chat(c, fresh.url, key, "Say 2."))
        assert {v for v, _ in served} == {name2}, served
        assert set(_recorded(factory, [i for _, i in served]).values()) == {name2}
        assert name1 not in engine.adapters() and name2 in engine.adapters()
        # roll back to v1: v2 is retired; the stale gateway now caches v2
        out = serving_switch.serve_version(PROJECT, 1, settings=settings, factory=factory)
        assert out["changed"] and out["previous"] == name2
        served = [_chat(c, stale.url, key, "Again.", stream=True)]  # refused inside a stream
        served += [_chat(c, stale.url, key, "Once more."), _chat(c, fresh.url, key, "Bye.")]
        assert {v for v, _ in served} == {name1}, served
        assert set(_recorded(factory, [i for _, i in served]).values()) == {name1}
        time.sleep(1.0)  # a round of the gateways' adapter sync would have run by now...
        loaded = set(engine.adapters())
    assert name1 in loaded and name2 not in loaded  # ... and resurrected nothing
    with factory() as db:
        statuses = dict(db.execute(select(PolicyVersionRow.name, PolicyVersionRow.status)).all())
    assert statuses == {name1: "serving", name2: "retired"}
    serving_switch.serve_version(PROJECT, 2, settings=settings, factory=factory)  # leave one loaded
    engine.unload(name2)
    engine.client.close()


def test_syncs_load_serving_and_unload_retired(
    target: Target, sqlite_url, tmp_path, adapter_dirs
) -> None:  # type: ignore[no-untyped-def]
    """The trainer's tick (publish.sync_engines) and a gateway's round (AdapterSync) make
    the same plan: an engine that lacks the serving version gets it from its live
    directory, and a retired version it still holds (an unload that missed it) goes."""
    from gateway.engines.adapter_sync import AdapterSync
    from gateway.engines.engine_client import EngineClient
    from trainer import publish, serving_switch

    factory, _ = setup_db(sqlite_url, project=PROJECT)
    root = tmp_path / f"sync-{target.kind}"
    settings = _settings(target, sqlite_url, tmp_path / "data")
    v1, name1 = _candidate(factory, root, adapter_dirs["a"], 1)
    v2, name2 = _candidate(factory, root, adapter_dirs["b"], 2)
    assert serving_switch.publish_version(factory, settings, v1)
    assert serving_switch.publish_version(factory, settings, v2)
    with EngineHTTP(target.url, target.headers, 120) as engine:
        # the engine restarted (lost v2) and an unload of v1 went missing
        assert engine.unload(name2)[0]
        assert engine.load(name1, str(root / PROJECT / name1))[0]
        done = publish.sync_engines(factory, [target.url], target.headers)
        assert sorted(done) == sorted([f"{target.url}:{name2}", f"-{target.url}:{name1}"])
        assert name2 in engine.adapters() and name1 not in engine.adapters()
        assert engine.adapters()[name2] == str(live_path(root / PROJECT / name2))
        assert publish.sync_engines(factory, [target.url], target.headers) == []

        assert engine.unload(name2)[0]
        assert engine.load(name1, str(root / PROJECT / name1))[0]

        async def round_() -> list[str]:
            client = EngineClient([target.url], api_key=target.api_key)
            try:
                return await AdapterSync(client, factory).sync_once()
            finally:
                await client.close()

        done = asyncio.run(round_())
        assert sorted(done) == sorted([f"{target.url}:{name2}", f"-{target.url}:{name1}"])
        assert set(engine.adapters()) >= {name2} and name1 not in engine.adapters()
        engine.unload(name2)


def test_seed_through_the_gateway(target: Target, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A client's seed is never a 400. On the embedded engine it reproduces the sample;
    on SGLang it is accepted (reproducible only with --enable-deterministic-inference)."""
    _, (key,) = setup_db(sqlite_url, project=PROJECT)
    kw = {"engine_api_key": target.api_key or ""}
    body = {
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": 42,
        "n": 2,
    }
    with (
        in_process_gateway(tmp_path / "gw", sqlite_url, target.url, **kw) as gw,
        httpx.Client(timeout=120) as c,
    ):
        answers = []
        for _ in range(2):
            r = c.post(
                f"{gw.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json=body,
            )
            assert r.status_code == 200, r.text
            answers.append([ch["message"]["content"] for ch in r.json()["choices"]])
    assert all(len(a) == 2 for a in answers)
    if target.kind == "embedded":
        assert answers[0] == answers[1]
