"""Engine/trainer agreement, measured, on both engines: for one adapter and recorded
samples, the engine's recorded logprobs (the embedded engine's, and real SGLang's: the
session's server, tests/conftest.py ``sglang``) and the trainer's recomputed ones agree
within 1e-3 per token (float32 on CPU, the real packaged model). The PPO loss's behaviour
weight pi_prox / mu is exactly this comparison: if they disagreed, IcePop would mask
on-policy tokens (``masked_mismatch_frac``) and the off-policy correction would be noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from core.engine_protocol import SGLANG_VERSION
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from tests.servers import MODEL_CACHE, engine_cmd, free_port, running
from tests.trainer.helpers import render
from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.policy import Policy, make_micro_batches

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", params=["embedded", f"sglang-{SGLANG_VERSION}"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """(url, headers) of the engine under test."""
    if request.param != "embedded":
        server = request.getfixturevalue("sglang")
        yield server.url, server.headers
        return
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(port, "--max-lora-rank", "8", "--context-length", "512")
    with running(cmd, {}, log, port) as p:
        yield p.url, {}


def test_engine_and_trainer_logprobs_agree(
    engine: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    engine_url, headers = engine
    cfg = TrainConfig(lora_rank=4, lora_alpha=8.0)
    policy = Policy.load(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE), cfg)
    with torch.no_grad():  # a non-zero adapter, so its delta is part of both sides
        gen = torch.Generator().manual_seed(3)
        for p in policy.params:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    adapter = tmp_path / "agree-adapter"
    name = f"agree-{tmp_path.name}"
    policy.save(adapter, policy.make_optimizer(cfg, None), {"name": "agree"})
    r = httpx.post(
        f"{engine_url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(adapter)},
        headers=headers,
        timeout=120,
    )
    assert r.status_code == 200, r.text

    samples = []
    for k, (question, temperature) in enumerate(
        (("What is 7 + 5? Reply with only the number.", 1.0), ("Name a color.", 0.7))
    ):
        ids = render(question)
        r = httpx.post(
            f"{engine_url}/generate",
            json={
                "input_ids": ids,
                "lora_path": name,
                "return_logprob": True,
                "sampling_params": {
                    "temperature": temperature,
                    "max_new_tokens": 12,
                    "n": 2,
                    "sampling_seed": 11 + k,
                },
            },
            headers=headers,
            timeout=120,
        )
        assert r.status_code == 200, r.text
        for i, out in enumerate(r.json()):
            lps = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
            assert len(lps) == len(out["output_ids"]) > 0
            samples.append(
                Sample(f"s{k}{i}", ids, out["output_ids"], lps, temperature, 0.0, f"g{k}", "t")
            )
    recomputed = policy.logprobs(make_micro_batches(samples, 4096), adapter=True)
    without = policy.logprobs(make_micro_batches(samples, 4096), adapter=False)
    worst = 0.0
    for s in samples:
        engine = torch.tensor(s.behav_logprobs)
        trainer = recomputed[s.interaction_id]
        worst = max(worst, float((engine - trainer).abs().max()))
        torch.testing.assert_close(trainer, engine, atol=1e-3, rtol=0)
    moved = max(
        float((recomputed[s.interaction_id] - without[s.interaction_id]).abs().max())
        for s in samples
    )
    assert moved > 1e-2, "the adapter should change the logprobs"
    print(f"max |engine - trainer| logprob: {worst:.2e}; adapter moved them by {moved:.2e}")
    httpx.post(
        f"{engine_url}/unload_lora_adapter", json={"lora_name": name}, headers=headers, timeout=60
    )
