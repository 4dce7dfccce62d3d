"""Engine/trainer agreement, measured, on both engines: for one adapter and recorded
samples, the engine's recorded logprobs and the trainer's recomputed ones (float32 on CPU,
the real packaged model) agree within 1e-3 per token on real SGLang (the session's server,
tests/conftest.py ``sglang``) and the embedded engine with ``--weights float``; with
``--weights int4`` (the default: bfloat16 inputs and outputs around each projection,
docs/engine.md "Weights") within 0.06 on average and 0.3 at most (measured with this
adapter, which moves logprobs by ~2: 0.033 and 0.095), far inside the IcePop band (a
weight of 0.5-2, |difference| < 0.69). The PPO loss's
behaviour weight pi_prox / mu is exactly this comparison: if they disagreed beyond the
band, IcePop would mask on-policy tokens (``masked_mismatch_frac``) and the off-policy
correction would be noise.
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


@pytest.fixture(
    scope="module", params=["embedded-float", "embedded-int4", f"sglang-{SGLANG_VERSION}"]
)
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str], bool]]:
    """(url, headers, exact) of the engine under test; ``exact``: float arithmetic."""
    if not request.param.startswith("embedded"):
        server = request.getfixturevalue("sglang")
        yield server.url, server.headers, True
        return
    weights = request.param.removeprefix("embedded-")
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(port, "--max-lora-rank", "8", "--context-length", "512", "--weights", weights)
    with running(cmd, {}, log, port) as p:
        yield p.url, {}, weights == "float"


def test_engine_and_trainer_logprobs_agree(
    engine: tuple[str, dict[str, str], bool], tmp_path: Path
) -> None:
    engine_url, headers, exact = engine
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
    diffs = torch.cat(
        [(torch.tensor(s.behav_logprobs) - recomputed[s.interaction_id]).abs() for s in samples]
    )
    worst = float(diffs.max())
    if exact:
        assert worst < 1e-3
    else:
        assert float(diffs.mean()) < 0.06 and worst < 0.3
    moved = max(
        float((recomputed[s.interaction_id] - without[s.interaction_id]).abs().max())
        for s in samples
    )
    assert moved > 1e-2, "the adapter should change the logprobs"
    print(
        f"|engine - trainer| logprob: mean {float(diffs.mean()):.2e}, max {worst:.2e}; "
        f"the adapter moved them by {moved:.2e}"
    )
    httpx.post(
        f"{engine_url}/unload_lora_adapter", json={"lora_name": name}, headers=headers, timeout=60
    )
