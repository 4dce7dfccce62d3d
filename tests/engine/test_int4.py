"""``--weights int4`` (engine/int4.py): projections on a 4-bit block grid kept packed and
multiplied by PyTorch's int4 CPU kernel (the packaged model's Q4_1 projections are on
it), an LM head in two passes with its likeliest rows in float; logprobs stay within the
measured drift of float32's, adapters still act."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
import torch.nn.functional as F

from engine import int4
from engine.int4 import BLOCK, Int4Weight, TwoPassHead, pack
from engine.llama import KVCache, LlamaModel
from tests.servers import in_process_engine

pytestmark = pytest.mark.timeout(300)


def _grid_weight(out_f: int, in_f: int, seed: int = 0) -> torch.Tensor:
    """Weights as a Q4_1 GGUF holds them: per block of 32 inputs, min + step * (0..15)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = in_f // BLOCK
    q = torch.randint(0, 16, (out_f, blocks, BLOCK), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # each block spans its grid, as the quantizer's min and max
    step = torch.rand(out_f, blocks, 1, generator=gen) * 0.01 + 1e-3
    low = -8 * step + torch.randn(out_f, blocks, 1, generator=gen) * 0.01
    return (q * step + low).view(out_f, in_f)


def test_a_grid_weight_packs_to_an_eighth_and_multiplies_as_float() -> None:
    w = _grid_weight(192, 576)
    packed = pack(w)
    assert isinstance(packed, Int4Weight)
    assert packed.nbytes * 6 < w.numel() * 4  # 4-bit codes + a bfloat16 step and offset per block
    x = torch.randn(3, 5, 576)
    want = F.linear(x, w)
    got = packed(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    # bfloat16 inputs, steps, offsets and outputs: an 8-bit mantissa's error, not more
    err = (got - want).abs().max() / want.abs().max()
    assert err < 0.02


def test_the_two_pass_head_has_float_top_logits_whatever_the_rows() -> None:
    w = torch.randn(4096, 128, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    want = F.linear(x, w)
    head = TwoPassHead.of(w)
    head = TwoPassHead(head.rough, head.weight, exact_top=16)
    got = head(x)
    top = want.topk(8, dim=-1).indices
    # the likeliest rows are float (the first pass ranks them among its 16)
    torch.testing.assert_close(got.gather(1, top), want.gather(1, top), atol=1e-5, rtol=0)
    assert not torch.equal(got, want)  # the rest keep the first pass's rounding
    assert (got - want).abs().max() / want.abs().max() < 0.02
    # a row's logits do not depend on the rows beside it (the step's batch)
    for i in range(3):
        torch.testing.assert_close(head(x[i : i + 1]), got[i : i + 1], atol=0, rtol=0)


def test_packing_row_chunks_gives_the_layout_of_the_whole(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    w4 = _grid_weight(256, 64)
    a = pack(w4)
    monkeypatch.setattr(int4, "CHUNK_ROWS", 64)
    b = pack(w4)
    assert a is not None and b is not None
    assert torch.equal(a.packed, b.packed) and torch.equal(a.steps_offsets, b.steps_offsets)


def test_projections_of_one_input_stack_into_one_call_and_split_back() -> None:
    parts = [pack(_grid_weight(rows, 128, seed)) for seed, rows in enumerate((64, 128, 64))]
    assert all(p is not None for p in parts)
    group = Int4Weight.stack(parts)  # type: ignore[arg-type]
    x = torch.randn(4, 128)
    assert group.out_features == 256
    assert pack(_grid_weight(24, 128)) is None  # the kernel packs rows by 16
    with pytest.raises(ValueError):  # nor do 64-row blocks join 48 rows
        Int4Weight.stack([parts[0], pack(_grid_weight(48, 128))])  # type: ignore[list-item]
    # the same codes; the kernel's blocking over rows may round an output differently
    # (one bfloat16 step at most); for the packaged model's q/k/v it gave identical outputs
    separate = torch.cat([p(x) for p in parts], -1)  # type: ignore[misc]
    torch.testing.assert_close(group(x), separate, rtol=1e-2, atol=1e-3)
    for view, part in zip(group.split(parts), parts, strict=True):  # type: ignore[arg-type]
        assert view.packed.data_ptr() != part.packed.data_ptr()  # type: ignore[union-attr]
        assert torch.equal(view(x), part(x))  # type: ignore[misc]


def test_weights_off_the_grid_stay_float() -> None:
    w = _grid_weight(64, 64)
    assert pack(w) is not None
    nudged = w.clone()
    nudged[3, 7] += 1e-4  # one value between two grid points
    assert pack(nudged) is None
    assert pack(torch.randn(64, 64)) is None  # a float checkpoint
    assert pack(torch.randn(64, 48)) is None  # inputs not a whole number of blocks


def _teacher_forced(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """log p(ids[j] | ids[:j]) for j >= 1, from one prefill."""
    cache = KVCache(model.cfg, 1, len(ids) + 1, model.dtype)
    _, every = model.prefill_batch_full([(ids, 0, 0)], cache, None, [True])
    logp = torch.log_softmax(every[0].float(), dim=-1)[:-1]
    return logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_the_packaged_model_packs_every_projection_and_keeps_its_logprobs(
    model_dir: Path, chat_ids: list[list[int]]
) -> None:
    float_model = LlamaModel(model_dir)
    int4_model = LlamaModel(model_dir, int4=True)
    assert float_model.int4_projections == 0
    assert int4_model.int4_projections == 30 * 7  # SmolLM2-135M's Q4_1 projections, all
    assert float_model.head is None and int4_model.head is not None  # the two-pass head
    # a greedy float32 continuation, teacher-forced through both
    ids = list(chat_ids[0])
    for _ in range(24):
        ids.append(int(_teacher_forced_last(float_model, ids)))
    diff = (_teacher_forced(int4_model, ids) - _teacher_forced(float_model, ids)).abs()
    # measured: mean 0.0125, max 0.075 over 256 tokens (bench/engine_dtype_drift.py)
    assert diff.mean() < 0.03 and diff.max() < 0.3


def _teacher_forced_last(model: LlamaModel, ids: list[int]) -> int:
    cache = KVCache(model.cfg, 1, len(ids) + 1, model.dtype)
    return int(model.prefill(ids, 0, cache, None).argmax())


def _prompt_logprobs(url: str, ids: list[int], lora: str | None) -> list[float]:
    r = httpx.post(
        f"{url}/generate",
        json={
            "input_ids": ids,
            "lora_path": lora,
            "return_logprob": True,
            "logprob_start_len": 0,
            "sampling_params": {"temperature": 0, "max_new_tokens": 2},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert len(meta["output_token_logprobs"]) == 2  # decode steps ran on the packed weights
    return [lp for lp, _, _ in meta["input_token_logprobs"][1:]]


def test_an_int4_engine_serves_with_adapters_within_the_drift_of_float32(
    client: httpx.Client, adapter_dirs: dict[str, Path], chat_ids: list[list[int]]
) -> None:
    ids = chat_ids[1]
    load = {"lora_name": "int4-a", "lora_path": str(adapter_dirs["a"])}
    assert client.post("/load_lora_adapter", json=load).status_code == 200
    float_url = str(client.base_url).rstrip("/")
    with in_process_engine(weights="int4") as url:
        info = httpx.get(f"{url}/get_server_info").json()
        assert info["weights"] == "int4" and info["int4_projections"] == 210
        assert info["two_pass_lm_head"] is True
        assert httpx.post(f"{url}/load_lora_adapter", json=load).status_code == 200
        base = _prompt_logprobs(url, ids, None)
        adapted = _prompt_logprobs(url, ids, "int4-a")
    want_base = _prompt_logprobs(float_url, ids, None)
    want_adapted = _prompt_logprobs(float_url, ids, "int4-a")
    client.post("/unload_lora_adapter", json={"lora_name": "int4-a"})

    def gap(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    assert gap(base, want_base) < 0.3 and gap(adapted, want_adapted) < 0.3
    assert gap(adapted, base) > 1.0  # the adapter acts on the packed model as on float32
