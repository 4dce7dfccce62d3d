"""The --mem-fraction-static that SGLang on CPU is started with (rlgate/sglang_memory.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgate.sglang_memory import WORKING_BYTES, with_fraction

# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64
CONFIG = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
GB = 10**9


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with (tmp_path / "model.safetensors").open("wb") as fh:
        fh.truncate(270 * 10**6)  # 135M parameters in bfloat16
    return tmp_path


def test_the_fraction_holds_weights_kv_cache_and_working_memory(model: Path) -> None:
    args = ["--device", "cpu", "--dtype", "float32", "--max-total-tokens", "8192"]
    out, plan = with_fraction(model, args, available=4 * GB)
    assert plan is not None
    assert plan.weights == 540 * 10**6  # stored in bfloat16, served in float32
    assert plan.kv_cache == 8192 * 2 * 30 * 3 * 64 * 4
    # enough for all three, and no more than 1% over
    assert plan.fraction * 4 * GB >= plan.weights + plan.kv_cache + WORKING_BYTES
    assert (plan.fraction - 0.01) * 4 * GB < plan.weights + plan.kv_cache + WORKING_BYTES
    assert out == [*args, "--mem-fraction-static", str(plan.fraction)]
    assert not plan.short and "of 4.0 GB available" in plan.reason()


def test_little_free_memory_is_said_and_a_lot_is_not_taken(model: Path) -> None:
    args = ["--device=cpu", "--context-length", "2048"]
    _, tight = with_fraction(model, args, available=3 * GB // 2)  # bfloat16: ~1.4 GB needed
    assert tight is not None and tight.fraction == 0.9 and tight.short
    assert "LESS MEMORY IS FREE" in tight.reason()
    _, roomy = with_fraction(model, args, available=200 * GB)
    assert roomy is not None and roomy.fraction == 0.05 and not roomy.short


def test_an_operators_fraction_and_a_gpu_are_left_alone(model: Path) -> None:
    own = ["--device", "cpu", "--mem-fraction-static=0.3"]
    assert with_fraction(model, own, available=GB) == (own, None)
    assert with_fraction(model, ["--tp", "2"], available=GB) == (["--tp", "2"], None)
