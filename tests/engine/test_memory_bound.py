"""The embedded engine's memory bound (engine/memory.py, ``--max-memory-gb``): the worst
case of a configuration, computed from the model's config before anything is loaded; a
configuration over the bound does not start and says what fits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.llama import LlamaConfig
from engine.memory import GB, MemoryBoundError, plan
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from engine.projections import PROJECTIONS
from tests.servers import MODEL_CACHE, REPO


@pytest.fixture(scope="module")
def cfg() -> LlamaConfig:
    return LlamaConfig.from_dir(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE))


def _plan(cfg: LlamaConfig, **kw):  # type: ignore[no-untyped-def]
    args = dict(slots=20, context=4096, max_rank=64, max_adapters=8, modules=frozenset(PROJECTIONS))
    return plan(cfg, torch.float32, **{**args, **kw})


def test_the_worst_case_is_the_weights_every_slot_full_and_every_adapter(cfg) -> None:
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    from engine.llama import LlamaModel

    model = LlamaModel(model_dir)
    tensors = [model.embed, *(t for layer in model.layers for t in layer.values())]
    tensors += [n.weight for n in (model.norm, *model.input_norms, *model.post_norms)]
    if model.lm_head is not model.embed:
        tensors.append(model.lm_head)
    p = _plan(cfg)
    assert p.weights == sum(t.numel() * t.element_size() for t in tensors)  # as loaded
    # SmolLM2-135M: 30 layers x 3 KV heads x 64, keys and values, float32
    assert p.kv_per_token == 2 * 30 * 3 * 64 * 4
    assert p.kv == 20 * 4096 * p.kv_per_token
    half = _plan(cfg, max_rank=32, modules=frozenset({"q_proj"}))
    assert half.adapter == 30 * (576 + 576) * 32 * 4  # A and B of q_proj at rank 32
    assert _plan(cfg, slots=10).kv * 2 == p.kv


def test_a_bound_under_the_worst_case_says_what_fits(cfg) -> None:
    p = _plan(cfg)
    p.check(None, 4)
    p.check(p.total / GB, 4)  # exactly at the bound: fits
    with pytest.raises(MemoryBoundError) as e:
        p.check(2.5, 4)
    msg = str(e.value)
    assert "over --max-memory-gb 2.5" in msg and "KV cache 3.77 GB (20 slots x 4096" in msg
    assert "--max-running-requests" in msg and "--context-length" in msg
    # what it names does fit
    slots = int(msg.split("--max-running-requests ")[1].split()[0])
    _plan(cfg, slots=slots + 4).check(2.5, 4)
    context = int(msg.split("--context-length ")[1].split()[0])
    _plan(cfg, context=context).check(2.5, 4)
    with pytest.raises(MemoryBoundError, match="the weights and adapters alone do not fit"):
        p.check(0.2, 4)


def test_the_engine_refuses_to_start_over_its_bound(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "engine", "--data-dir", str(MODEL_CACHE), "--port", "1"]
    done = subprocess.run(
        [*cmd, "--max-memory-gb", "1.5"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert "over --max-memory-gb 1.5; at most --context-length" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
