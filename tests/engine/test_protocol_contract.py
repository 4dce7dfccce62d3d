"""Request/response shapes of SGLang's native protocol subset that rlgate relies on.

Runs against the embedded engine by default. With ``RLGATE_ENGINE_URLS`` set (comma
separated; the first URL is used) it runs against that server instead, e.g. a real
SGLang server (needs a GPU) started with SmolLM2-135M-Instruct and ``--enable-lora``;
the LoRA contract then needs ``RLGATE_CONTRACT_ADAPTER_PATH``, a PEFT adapter directory
for that model as the *server* sees it, and a server started with ``--api-key`` needs
``RLGATE_ENGINE_API_KEY``. See docs/engine.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.timeout(180)

# Read at import: tests/conftest.py clears RLGATE_* variables while each test runs.
EXTERNAL_URLS = os.environ.get("RLGATE_ENGINE_URLS", "").strip()
EXTERNAL_ADAPTER = os.environ.get("RLGATE_CONTRACT_ADAPTER_PATH", "")
EXTERNAL_KEY = os.environ.get("RLGATE_ENGINE_API_KEY", "")

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2]  # small ids valid for any vocab


@pytest.fixture(scope="module")
def api(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    headers = {}
    if EXTERNAL_URLS:
        url = EXTERNAL_URLS.split(",")[0].strip().rstrip("/")
        if EXTERNAL_KEY:
            headers["Authorization"] = f"Bearer {EXTERNAL_KEY}"
    else:
        url = request.getfixturevalue("engine_url")
    with httpx.Client(base_url=url, timeout=120, headers=headers) as client:
        yield client


@pytest.fixture(scope="module")
def adapter_path(request: pytest.FixtureRequest) -> str:
    if EXTERNAL_URLS:
        if not EXTERNAL_ADAPTER:
            pytest.skip("set RLGATE_CONTRACT_ADAPTER_PATH to test LoRA against an external engine")
        return EXTERNAL_ADAPTER
    return str(request.getfixturevalue("adapter_dirs")["a"])


def _post(api: httpx.Client, body: dict[str, Any]) -> Any:
    r = api.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _check_output(out: dict[str, Any], logprobs: bool = False, top: int = 0) -> None:
    assert isinstance(out["text"], str)
    assert all(isinstance(t, int) for t in out["output_ids"])
    meta = out["meta_info"]
    for key in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"):
        assert key in meta, key
    assert meta["finish_reason"]["type"] in ("stop", "length", "abort")
    assert meta["completion_tokens"] == len(out["output_ids"])
    if logprobs:
        entries = meta["output_token_logprobs"]
        assert len(entries) == len(out["output_ids"])
        for (lp, tid, text), expected in zip(entries, out["output_ids"], strict=True):
            assert isinstance(lp, float) and lp <= 0.0 and tid == expected and text is None
    if top:
        assert len(meta["output_top_logprobs"]) == len(out["output_ids"])
        for position in meta["output_top_logprobs"]:
            assert len(position) == top
            assert all(isinstance(lp, float) and isinstance(t, int) for lp, t, _ in position)


def test_health_and_info(api: httpx.Client) -> None:
    assert api.get("/health").status_code == 200
    info = api.get("/get_model_info").json()
    assert {"model_path", "tokenizer_path", "is_generation"} <= set(info)
    assert info["is_generation"] is True
    models = api.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    assert "weight_version" in api.get("/get_weight_version").json()


def test_generate_single(api: httpx.Client) -> None:
    out = _post(
        api,
        {
            "input_ids": PROMPT,
            "rid": "contract-single",
            "sampling_params": {"temperature": 0, "max_new_tokens": 6},
            "return_logprob": True,
            "top_logprobs_num": 2,
        },
    )
    assert isinstance(out, dict)
    _check_output(out, logprobs=True, top=2)
    assert out["meta_info"]["id"] == "contract-single"
    assert out["meta_info"]["prompt_tokens"] == len(PROMPT)
    assert 1 <= out["meta_info"]["completion_tokens"] <= 6
    if out["meta_info"]["finish_reason"]["type"] == "length":
        assert out["meta_info"]["completion_tokens"] == 6


def test_generate_batch_and_n(api: httpx.Client) -> None:
    outs = _post(
        api,
        {
            "input_ids": [PROMPT, PROMPT[:5]],
            "sampling_params": {"temperature": 0, "max_new_tokens": 4},
        },
    )
    assert isinstance(outs, list) and len(outs) == 2
    for out in outs:
        _check_output(out)
    samples = _post(
        api,
        {"input_ids": PROMPT, "sampling_params": {"temperature": 0.8, "max_new_tokens": 4, "n": 2}},
    )
    assert isinstance(samples, list) and len(samples) == 2


def test_eos_is_in_output_ids(api: httpx.Client) -> None:
    free = _post(
        api,
        {
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        },
    )
    stop_id = free["output_ids"][1]
    out = _post(
        api,
        {
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0, "max_new_tokens": 8, "stop_token_ids": [stop_id]},
        },
    )
    reason = out["meta_info"]["finish_reason"]
    if reason["type"] == "stop":
        assert reason["matched"] == out["output_ids"][-1]


def test_streaming(api: httpx.Client) -> None:
    body = {
        "input_ids": PROMPT,
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
    }
    with api.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(chunks[-1]["output_ids"]) == 5
    for a, b in zip(chunks, chunks[1:], strict=False):  # cumulative output
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]


def test_abort_request_accepts_unknown_rid(api: httpx.Client) -> None:
    assert api.post("/abort_request", json={"rid": "no-such-request"}).status_code == 200


def test_lora_load_generate_unload(api: httpx.Client, adapter_path: str) -> None:
    name = "contract-adapter"
    r = api.post("/load_lora_adapter", json={"lora_name": name, "lora_path": adapter_path})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and name in body["loaded_adapters"]
    try:
        ids = [m["id"] for m in api.get("/v1/models").json()["data"]]
        assert name in ids
        out = _post(
            api,
            {
                "input_ids": PROMPT,
                "lora_path": name,
                "sampling_params": {"temperature": 0, "max_new_tokens": 4},
            },
        )
        _check_output(out)
        batch = _post(
            api,
            {
                "input_ids": [PROMPT, PROMPT],
                "lora_path": [name, None],
                "sampling_params": {"temperature": 0, "max_new_tokens": 4},
            },
        )
        assert len(batch) == 2
    finally:
        r = api.post("/unload_lora_adapter", json={"lora_name": name})
    assert r.status_code == 200 and r.json()["success"] is True
    assert name not in r.json()["loaded_adapters"]
    r = api.post(
        "/generate",
        json={"input_ids": PROMPT, "lora_path": name, "sampling_params": {"max_new_tokens": 2}},
    )
    assert r.status_code == 400
