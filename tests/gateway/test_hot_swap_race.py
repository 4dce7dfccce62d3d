"""A new adapter is published and the old one unloaded while a gateway still has the old
name cached: the request is retried once on the new version instead of failing the
agent's call. The engine loads each version from its live directory, which the trainer's
publish removes before unloading it (core/live_adapters.py), so the engine cannot re-load
the old version on demand and answers 400 for it. Real engine."""

from __future__ import annotations

import httpx
import openai
import torch

from core.db import transaction
from core.keys import create_key, ensure_project
from core.live_adapters import drop_live, make_live
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow
from tests.gateway.fake_engine import in_process_gateway

PROJECT = "swap"
MSG = [{"role": "user", "content": "Say hi."}]


def _adapter(model_dir, out) -> None:  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    model.save_pretrained(str(out))


def test_request_meets_an_unloaded_adapter_and_retries_on_the_new_one(
    sqlite_url, engine, model_dir, tmp_path
):
    upgrade(sqlite_url)
    from core.db import make_engine, session_factory

    factory = session_factory(make_engine(sqlite_url))
    names = ["swap-policy-v1", "swap-policy-v2"]
    for name in names:
        _adapter(model_dir, tmp_path / name)
    r = httpx.post(
        engine.url + "/load_lora_adapter",
        timeout=60,
        json={"lora_name": names[0], "lora_path": str(make_live(tmp_path / names[0]))},
    )
    assert r.status_code == 200, r.text
    with transaction(factory) as db:
        ensure_project(db, PROJECT)
        _, key = create_key(db, PROJECT, "agent")
        for i, name in enumerate(names):
            db.add(
                PolicyVersionRow(
                    id=f"pv-{name}",
                    project_id=PROJECT,
                    name=name,
                    version=i + 1,
                    base_model="smollm2",
                    path=str(tmp_path / name),
                    lora_config={},
                    status="serving" if i == 0 else "candidate",
                    created_at=utcnow(),
                )
            )
    # a long serving cache: the gateway surely still holds v1 when it is gone
    with in_process_gateway(tmp_path / "gw", sqlite_url, engine.url, serving_cache_s="300") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="rlgate-policy", messages=MSG, max_tokens=3, temperature=0
        )
        assert raw.headers["x-rlgate-policy-version"] == names[0]
        # the trainer's publish: load v2, make it serving, retire v1 (its live dir, unload)
        r = httpx.post(
            engine.url + "/load_lora_adapter",
            timeout=60,
            json={"lora_name": names[1], "lora_path": str(make_live(tmp_path / names[1]))},
        )
        assert r.status_code == 200, r.text
        with transaction(factory) as db:
            db.get(PolicyVersionRow, f"pv-{names[0]}").status = "retired"
            db.get(PolicyVersionRow, f"pv-{names[1]}").status = "serving"
        drop_live(tmp_path / names[0])
        r = httpx.post(
            engine.url + "/unload_lora_adapter", timeout=60, json={"lora_name": names[0]}
        )
        assert r.status_code == 200, r.text
        for stream in (False, True):
            raw = client.chat.completions.with_raw_response.create(
                model="rlgate-policy", messages=MSG, max_tokens=3, temperature=0, stream=stream
            )
            assert raw.status_code == 200
            assert raw.headers["x-rlgate-policy-version"] == names[1]
            if stream:
                assert list(raw.parse())
    httpx.post(engine.url + "/unload_lora_adapter", timeout=60, json={"lora_name": names[1]})
