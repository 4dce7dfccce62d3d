"""End to end on real SGLang (the session's server, tests/conftest.py ``sglang``), a
gateway, a real Celery worker (Redis) and PostgreSQL:

calls through the three APIs, streamed and not, recorded token-exactly; ratings, then a
training run on the worker; the adapter published into SGLang and the next call served
by it with its policy_version; a second run, then a rollback, after which the retired
version serves nothing, also through a gateway whose serving cache is stale; structured
output. The engine/trainer logprob agreement on SGLang is tests/trainer/test_agreement.py.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.engine_http import EngineHTTP
from core.keys import create_key
from core.migrate import upgrade
from schemas.tables import InteractionRow, PolicyVersionRow
from tests.faults.helpers import call_shapes, wait_rows
from tests.servers import gateway
from tests.trainer.helpers import MODEL_DIR, make_project, rewards
from tests.trainer.test_e2e import TRAINING, Worker, _env, _use_env, _wait_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _rate(c: httpx.Client, url: str, key: str, questions: list[str]) -> list[str]:
    """Two sampled answers per question, one rated good and one bad; their ids."""
    rated = []
    for q in questions:
        r = c.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "messages": [{"role": "user", "content": q}],
                "n": 2,
                "temperature": 1.0,
                "max_tokens": 6,
            },
        )
        assert r.status_code == 200, r.text
        for i, value in ((0, 1), (1, 0)):
            f = c.post(
                f"{url}/feedback",
                headers={"Authorization": f"Bearer {key}"},
                json={"interaction_id": f"{r.json()['id']}.{i}", "value": value, "scale": "binary"},
            )
            assert f.status_code == 200, f.text
            rated.append(f"{r.json()['id']}.{i}")
    return rated


def _train(factory, settings, pid: str, queue: str, worker: Worker) -> str:  # type: ignore[no-untyped-def]
    from trainer import runs
    from trainer.celery_base import make_celery

    run_id = runs.create_queued(factory, pid, "manual")
    make_celery(settings).send_task(
        "rlgate.train_project", args=[pid, "manual", run_id], queue=queue
    )
    run = _wait_run(factory, run_id, ("published", "failed", "trained-not-published"), 600)
    assert run.status == "published", (run.error, worker.log.read_text()[-3000:])
    with factory() as db:
        return db.get(PolicyVersionRow, run.policy_version_id).name


def _unloaded(engine: EngineHTTP, name: str, timeout: float = 60) -> bool:
    """Whether ``name`` leaves the engine within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while name in engine.adapters():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def _served(c: httpx.Client, url: str, key: str, text: str) -> tuple[str, str]:
    r = c.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 2},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-rlgate-policy-version"], r.json()["id"]


def _versions_of(factory, ids: list[str]) -> dict[str, str]:  # type: ignore[no-untyped-def]
    wait_rows(factory, set(ids), timeout=60)
    with factory() as db:
        found = db.execute(
            select(InteractionRow.id, InteractionRow.policy_version).where(
                InteractionRow.id.in_(ids)
            )
        ).all()
    return dict(found)


def test_sglang_record_rate_train_publish_rollback(
    sglang, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from trainer import serving_switch

    upgrade(pg_url)
    factory = session_factory(make_engine(pg_url))
    queue = f"rlgate-test-{secrets.token_hex(4)}"
    env = _env(
        tmp_path,
        pg_url,
        sglang.url,
        RLGATE_BROKER_URL="redis://127.0.0.1:6379/0",
        RLGATE_ENGINE_API_KEY=sglang.api_key,
    )
    settings = _use_env(monkeypatch, env)
    pid = make_project(factory, TRAINING)
    with transaction(factory) as db:
        _, key = create_key(db, pid, "agent")
    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    kw = {"engine_api_key": sglang.api_key}
    engine = EngineHTTP(sglang.url, sglang.headers, 120)

    with (
        gateway(tmp_path / "gw", pg_url, sglang.url, **kw) as gw,
        httpx.Client(timeout=300) as c,
    ):
        # 1. the three APIs, streamed and not, recorded token-exactly
        for stream in (False, True):
            for api, (path, body) in call_shapes("Say hello.", stream).items():
                r = c.post(gw.url + path, headers={"Authorization": f"Bearer {key}"}, json=body)
                assert r.status_code == 200, (api, stream, r.text)
        r = c.post(
            f"{gw.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "messages": [{"role": "user", "content": "Name a fruit."}],
                "max_tokens": 4,
                "logprobs": True,
            },
        )
        assert r.status_code == 200, r.text
        lp_call = r.json()
        # structured output: the grammar holds on SGLang (xgrammar)
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        r = c.post(
            f"{gw.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "messages": [{"role": "user", "content": "Is water wet? Answer in JSON."}],
                "max_tokens": 48,  # the grammar allows whitespace: 12 sampled tokens cut it
                "temperature": 0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema},
                },
            },
        )
        assert r.status_code == 200, r.text
        assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["ok"], bool)
        deadline = time.monotonic() + 60
        while True:
            with factory() as db:
                rows = list(
                    db.scalars(select(InteractionRow).where(InteractionRow.project_id == pid))
                )
            if len(rows) >= 8 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert len(rows) == 8
        for row in rows:
            assert len(row.completion_token_ids) == len(row.completion_logprobs) > 0
            assert row.engine_url == sglang.url and row.policy_version == "base"
            text = tok.decode(row.completion_token_ids, skip_special_tokens=True)
            assert text == (row.output or {}).get("text"), (text, row.output)
        recorded = next(x for x in rows if x.id == lp_call["id"])
        sent = [t["logprob"] for t in lp_call["choices"][0]["logprobs"]["content"]]
        assert recorded.completion_logprobs == pytest.approx(sent, abs=1e-6)

        # 2. ratings, a run on a real worker, published into SGLang, served next
        rated = _rate(c, gw.url, key, ["What is 2+2?", "Name a color."])
        assert sorted(rewards(factory, rated).values()) == [-1.0, -1.0, 1.0, 1.0]
        worker = Worker(env, queue, tmp_path / "worker.log")
        try:
            v1 = _train(factory, settings, pid, queue, worker)
            assert v1 in engine.adapters()
            time.sleep(0.6)  # the gateway's serving cache
            version, call = _served(c, gw.url, key, "Say hi.")
            assert version == v1 and _versions_of(factory, [call]) == {call: v1}

            # 3. a second run on v1's samples, a stale gateway, then the rollback
            with gateway(
                tmp_path / "gw-stale", pg_url, sglang.url, serving_cache_s="3600", **kw
            ) as stale:
                assert _served(c, stale.url, key, "Hi.")[0] == v1  # caches v1 for an hour
                _rate(c, gw.url, key, ["Say hi.", "Pick a fruit."])
                v2 = _train(factory, settings, pid, queue, worker)
                assert v2 != v1 and v2 in engine.adapters()
                # the run is published when v2 serves; the worker then unloads v1
                assert _unloaded(engine, v1), engine.adapters()
                calls = [_served(c, stale.url, key, "Count to two.")]
                calls.append(_served(c, gw.url, key, "Count to three."))
                assert {v for v, _ in calls} == {v2}, calls
                assert set(_versions_of(factory, [i for _, i in calls]).values()) == {v2}
                out = serving_switch.serve_version(pid, 1, settings=settings, factory=factory)
                assert out == {"name": v1, "previous": v2, "changed": True}
                calls = [_served(c, stale.url, key, f"Again {i}.") for i in range(2)]
                calls.append(_served(c, gw.url, key, "Bye."))
                assert {v for v, _ in calls} == {v1}, calls  # v2 serves nothing
                assert set(_versions_of(factory, [i for _, i in calls]).values()) == {v1}
                loaded = set(engine.adapters())
                assert v1 in loaded and v2 not in loaded
        finally:
            worker.stop()
    engine.unload(v1)
    engine.client.close()
