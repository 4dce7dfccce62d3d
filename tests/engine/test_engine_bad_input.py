"""Bad input gets a 400 with a message; the engine keeps serving.

The embedded engine here is served from this process (tests/servers.py
in_process_engine: its app and scheduler, the real packaged model), shaped as the
session's engine process (tests/engine/conftest.py ``engine_url``): what is tested is what
it answers over HTTP, not its process."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.engine.conftest import MAX_LORA_RANK
from tests.servers import in_process_engine

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with (
        in_process_engine(
            max_lora_rank=MAX_LORA_RANK,
            max_loaded_loras=3,
            max_running_requests=8,
            context_length=1024,
        ) as url,
        httpx.Client(base_url=url, timeout=120) as c,
    ):
        yield c


BAD = [
    ({"input_ids": []}, "empty"),
    ({"input_ids": [[1, 2], []]}, "empty"),
    ({}, "exactly one of input_ids or text"),
    ({"input_ids": [1], "text": "hi"}, "exactly one of input_ids or text"),
    ({"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "temperature"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1], "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": [1], "sampling_params": {"min_p": 2}}, "min_p"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"n": 0}}, "n"),
    ({"input_ids": [1], "sampling_params": {"no_such_param": 1}}, "no_such_param"),
    ({"input_ids": [1], "sampling_params": {"repetition_penalty": 1.5}}, "not supported"),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 2.5}}, "frequency_penalty"),
    ({"input_ids": [1], "sampling_params": {"presence_penalty": -3}}, "presence_penalty"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 2000}}, "context length"),
    ({"input_ids": [5] * 1020, "sampling_params": {"max_new_tokens": 8}}, "context length"),
    ({"input_ids": [10_000_000]}, "token ids"),
    ({"input_ids": [1], "lora_path": "no-such-adapter"}, "unknown LoRA adapter"),
    ({"input_ids": [[1], [2]], "lora_path": ["a"]}, "lora_path"),
    ({"input_ids": "not ids"}, "input_ids"),
]


@pytest.mark.parametrize(("body", "needle"), BAD)
def test_bad_generate_is_400(client, body, needle) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/generate", json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert needle in message


def test_invalid_json_and_engine_survives(generate, client) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert client.get("/health_generate").status_code == 200
    out = generate(client, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3})
    assert out["meta_info"]["completion_tokens"] == 3


def test_bad_adapter_requests(client) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/load_lora_adapter", json={"lora_name": "x"})
    assert r.status_code == 400 and r.json()["success"] is False
    r = client.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"})
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error_message"]
