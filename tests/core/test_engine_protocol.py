"""core/engine_protocol.py and core/live_adapters.py without an engine: the readings of
every answer shape SGLang 0.5.23 and the embedded engine give (as the contract suite saw
them), the sync plan, and the live directories."""

from __future__ import annotations

import os

import pytest

from core import engine_adapters
from core import engine_protocol as proto
from core.live_adapters import drop_live, live_path, make_live


def test_bodies_name_sglangs_fields() -> None:
    body = proto.generate_body(
        [1, 2], proto.Sampling(max_new_tokens=3, seed=9, stop=["x"]), adapter="v1", rid="r"
    )
    assert body["sampling_params"]["sampling_seed"] == 9 and "seed" not in body["sampling_params"]
    assert body["lora_path"] == "v1" and body["rid"] == "r" and body["return_logprob"] is True
    assert proto.generate_body([1], proto.Sampling(max_new_tokens=1))["lora_path"] is None


def test_error_shapes() -> None:
    assert proto.error_message(b'{"error": {"message": "bad"}}') == "bad"
    assert proto.error_message(b'{"error": "unknown field `seed`"}') == "unknown field `seed`"
    assert proto.error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert proto.error_message(b"plain") == "plain"
    with pytest.raises(proto.EngineRefused) as e:
        proto.stream_event(b'data: {"error": {"message": "gone", "code": 400}}')
    assert (e.value.status, e.value.message) == (400, "gone")
    assert proto.stream_event(b"data: [DONE]") is proto.DONE
    assert proto.stream_event(b": keep-alive") is None


def test_answers_and_streams() -> None:
    meta = {"output_token_logprobs": [[-0.5, 7, None]], "finish_reason": {"type": "stop"}}
    out = proto.read_output({"text": "a", "output_ids": [7], "meta_info": meta})
    assert (out.ids, out.logprobs, out.finish_reason) == ([7], [-0.5], "stop")
    with pytest.raises(proto.BadAnswer):
        proto.read_output({"text": "a", "output_ids": [7, 8], "meta_info": meta})
    reader = proto.StreamReader()
    first = reader.feed(
        {"text": "a", "output_ids": [7], "meta_info": meta | {"finish_reason": None}}
    )
    second = reader.feed(
        {
            "text": "ab",
            "output_ids": [7, 8],
            "meta_info": {"output_token_logprobs": [[-0.5, 7, None], [-0.1, 8, None]]}
            | {"finish_reason": {"type": "length"}},
        }
    )
    assert (first.ids, first.text, second.ids, second.text) == ([7], "a", [8], "b")
    assert reader.output().ids == [7, 8] and reader.output().finish_reason == "length"


def test_adapter_answers() -> None:
    assert engine_adapters.load_result(400, {"error_message": "x is already loaded"}, "x")[0]
    assert not engine_adapters.load_result(400, {"error_message": "bad path"}, "x")[0]
    gone = {
        "success": False,
        "error_message": "LoRA with name x does not exist.",
        "loaded_adapters": None,
    }
    assert engine_adapters.unload_result(400, gone, "x")[0]
    assert not engine_adapters.unload_result(400, {"error_message": "still used"}, "x")[0]
    models = {
        "data": [{"id": "base", "parent": None}, {"id": "v1", "parent": "base", "root": "/l/v1"}]
    }
    assert engine_adapters.loaded_adapters(models) == {"v1": "/l/v1"}
    assert engine_adapters.worker_urls({"workers": [{"url": "http://a/"}]}) == ["http://a"]
    assert engine_adapters.worker_urls({"urls": ["http://b"]}) == ["http://b"]


def test_sync_plan_loads_serving_and_unloads_only_retired() -> None:
    plan = engine_adapters.sync_plan(
        {"v3": "/live/v3", "w1": "/live/w1"},
        {"v2": "/live/v2", "w1": "/live/w1", "mine": "/somewhere"},
        {"v1", "v2"},
    )
    assert plan.load == [("v3", "/live/v3")] and plan.unload == ["v2"]  # "mine" is left alone


def test_live_directories(tmp_path) -> None:  # type: ignore[no-untyped-def]
    stored = tmp_path / "p" / "p-policy-v1"
    stored.mkdir(parents=True)
    (stored / "adapter_config.json").write_text("{}")
    (stored / "adapter_model.safetensors").write_bytes(b"w")
    (stored / "optimizer.pt").write_bytes(b"o")
    live = make_live(stored)
    assert live == live_path(stored) == tmp_path / "p" / "live" / "p-policy-v1"
    assert sorted(f.name for f in live.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert (
        os.stat(live / "adapter_model.safetensors").st_ino
        == os.stat(stored / "adapter_model.safetensors").st_ino
    )
    assert make_live(stored) == live  # again: kept
    drop_live(stored)
    assert not live.exists() and (stored / "adapter_model.safetensors").is_file()
    drop_live(stored)  # again: nothing to do
    with pytest.raises(FileNotFoundError):
        make_live(tmp_path / "p" / "empty")
