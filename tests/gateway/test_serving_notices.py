"""A published version is served at once by a gateway whose cached pointer is still
fresh: on PostgreSQL the switch (trainer/publish.py ``switch_serving``) sends a notice
that drops the gateway's cached pointer (core/serving_events.py). The gateway's cache
here lasts 300 s, so without the notice it would serve the old version for minutes.
Real engine, real gateway process, PostgreSQL."""

from __future__ import annotations

import time

import httpx
import openai

from core.db import make_engine, session_factory, transaction
from core.keys import create_key, ensure_project
from core.live_adapters import make_live
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow
from tests.gateway.test_hot_swap_race import MSG, _adapter
from tests.servers import gateway
from trainer.publish import switch_serving

PROJECT = "notices"


def test_a_switch_is_served_at_once_despite_a_fresh_cache(pg_url, engine, model_dir, tmp_path):  # type: ignore[no-untyped-def]
    upgrade(pg_url)
    db = make_engine(pg_url)
    factory = session_factory(db)
    names = [f"notices-policy-v{i}" for i in (1, 2)]
    for name in names:
        _adapter(model_dir, tmp_path / name)
        r = httpx.post(
            engine.url + "/load_lora_adapter",
            timeout=60,
            json={"lora_name": name, "lora_path": str(make_live(tmp_path / name))},
        )
        assert r.status_code == 200, r.text
    with transaction(factory) as s:
        ensure_project(s, PROJECT)
        _, key = create_key(s, PROJECT, "agent")
        for i, name in enumerate(names):
            s.add(
                PolicyVersionRow(
                    id=f"pv-{name}", project_id=PROJECT, name=name, version=i + 1,
                    base_model="smollm2", path=str(tmp_path / name), lora_config={},
                    status="candidate", created_at=utcnow(),
                )
            )  # fmt: skip
    switch_serving(factory, PROJECT, f"pv-{names[0]}", actor="test", action="adapter.promote")
    try:
        with gateway(tmp_path / "gw", pg_url, engine.url, serving_cache_s="300") as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)

            def served() -> str:
                raw = client.chat.completions.with_raw_response.create(
                    model="rlgate-policy", messages=MSG, max_tokens=1, temperature=0
                )
                return raw.headers["x-rlgate-policy-version"]

            assert served() == names[0]  # now cached for 300 s
            switch_serving(
                factory, PROJECT, f"pv-{names[1]}", actor="test", action="adapter.promote"
            )
            deadline = time.monotonic() + 15
            seen = served()
            while seen != names[1] and time.monotonic() < deadline:
                time.sleep(0.1)
                seen = served()
            assert seen == names[1]
    finally:
        for name in names:
            httpx.post(engine.url + "/unload_lora_adapter", timeout=60, json={"lora_name": name})
        db.dispose()
