"""LoRA adapters: load/unload, equality with HF+PEFT, per-row adapters in one batch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(300)
EOS = [2]


def _greedy(ids: list[int], n: int = 16, lora: str | None = None) -> dict:  # type: ignore[type-arg]
    return {
        "input_ids": ids,
        "lora_path": lora,
        "sampling_params": {"temperature": 0, "max_new_tokens": n},
    }


def test_adapter_matches_peft_and_unload_restores_base(  # type: ignore[no-untyped-def]
    generate, hf_greedy, client, model_dir, adapter_dirs, chat_ids
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = chat_ids[1]
    base = generate(client, **_greedy(ids))["output_ids"]
    r = client.post(
        "/load_lora_adapter", json={"lora_name": "solo", "lora_path": str(adapter_dirs["a"])}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["error_message"] == ""
    assert body["loaded_adapters"]["solo"] == str(adapter_dirs["a"])
    models = client.get("/v1/models").json()["data"]
    solo = next(m for m in models if m["id"] == "solo")
    assert solo["parent"] == models[0]["id"] and models[0]["parent"] is None

    with_adapter = generate(client, **_greedy(ids, lora="solo"))["output_ids"]
    assert with_adapter != base

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(hf, str(adapter_dirs["a"])).eval()
    assert with_adapter == hf_greedy(peft_model, ids, 16, EOS)

    r = client.post("/unload_lora_adapter", json={"lora_name": "solo"})
    assert r.status_code == 200 and r.json()["success"] is True
    assert "solo" not in r.json()["loaded_adapters"]
    assert generate(client, **_greedy(ids))["output_ids"] == base
    # as SGLang: a request naming it loads it again from its path (the fence that stops
    # this is the trainer's live directory: test_engine_contract.py)
    assert generate(client, **_greedy(ids, lora="solo"))["output_ids"] == with_adapter
    assert client.post("/unload_lora_adapter", json={"lora_name": "solo"}).status_code == 200
    r = client.post("/generate", json=_greedy(ids, lora="never-loaded"))
    assert r.status_code == 400 and "never-loaded" in r.json()["error"]["message"]


def test_mixed_adapters_in_one_batch(generate, client, loaded_adapters, chat_ids) -> None:  # type: ignore[no-untyped-def]
    names = [None, loaded_adapters["a"], loaded_adapters["b"]]
    bodies = [
        {
            **_greedy(ids, 10, name),
            "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
        }
        for ids in (chat_ids[1], chat_ids[4])
        for name in names
    ]
    serial = [generate(client, **b)["output_ids"] for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = [r["output_ids"] for r in pool.map(lambda b: generate(client, **b), bodies)]
    assert together == serial
    # one batched request with a per-prompt adapter list
    batch = generate(
        client,
        input_ids=[b["input_ids"] for b in bodies],
        lora_path=[b["lora_path"] for b in bodies],
        sampling_params=bodies[0]["sampling_params"],
    )
    assert [r["output_ids"] for r in batch] == serial
    # on the same prompt, base and both adapters really differ
    assert len({tuple(serial[0]), tuple(serial[1]), tuple(serial[2])}) == 3


def test_adapter_limits(client, adapter_dirs, loaded_adapters, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = client.post(
        "/load_lora_adapter", json={"lora_name": "big", "lora_path": str(adapter_dirs["too_big"])}
    )
    assert r.status_code == 400
    body = r.json()
    assert body["success"] is False and "max-lora-rank" in body["error_message"]
    assert "big" not in body["loaded_adapters"]
    # same name twice
    r = client.post(
        "/load_lora_adapter",
        json={"lora_name": loaded_adapters["a"], "lora_path": str(adapter_dirs["a"])},
    )
    assert r.status_code == 400 and "already loaded" in r.json()["error_message"]
    # not a PEFT directory
    r = client.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error_message"]
    # the engine allows 3 loaded adapters (2 are loaded by the session fixture)
    r = client.post(
        "/load_lora_adapter", json={"lora_name": "third", "lora_path": str(adapter_dirs["b"])}
    )
    assert r.status_code == 200
    r = client.post(
        "/load_lora_adapter", json={"lora_name": "fourth", "lora_path": str(adapter_dirs["b"])}
    )
    assert r.status_code == 400 and "max-loaded-loras" in r.json()["error_message"]
    assert client.post("/unload_lora_adapter", json={"lora_name": "third"}).status_code == 200
    r = client.post("/unload_lora_adapter", json={"lora_name": "never-loaded"})
    assert r.status_code == 400 and r.json()["success"] is False


def test_unload_waits_for_running_requests(generate, client, adapter_dirs, chat_ids) -> None:  # type: ignore[no-untyped-def]
    r = client.post(
        "/load_lora_adapter", json={"lora_name": "busy", "lora_path": str(adapter_dirs["b"])}
    )
    assert r.status_code == 200
    body = {
        "input_ids": chat_ids[4],
        "lora_path": "busy",
        "sampling_params": {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True},
    }
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(generate, client, **body)
        while client.get("/get_server_info").json()["running"] == 0:
            pass
        unload = client.post("/unload_lora_adapter", json={"lora_name": "busy"})
        result = running.result(timeout=120)
    assert unload.status_code == 200
    assert result["meta_info"]["finish_reason"]["type"] == "length"
    assert result["meta_info"]["completion_tokens"] == 40
