"""What scripts/device_check.py compares with: the packaged SmolLM2-135M-Instruct's
architecture (or a tiny one) with random, seeded weights, the synthetic training batch,
the tolerances of a bfloat16 target against CPU float32, and the PASS/FAIL report."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data import Sample  # noqa: E402

# config.json of the packaged SmolLM2-135M-Instruct as engine/model_files.py converts it.
SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 9.999999747378752e-06,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}
TINY = {
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
}
# Tolerances of the bfloat16 target against CPU float32 (bf16 keeps 8 mantissa bits, a
# relative rounding of ~4e-3 per operation; errors add up over the layers).
TOL = {
    "logprob_max_abs": 0.15,  # nats, any sampled token
    "logprob_mean_abs": 0.03,
    "loss_abs": 0.02,  # the PPO loss is O(0.1-1) on this batch
    "grad_rel_l2": 0.08,  # ||g_t - g_ref|| / ||g_ref|| over all LoRA gradients
    "update_cos": 0.95,  # cosine of the AdamW weight changes (sign-like on step 1)
    "engine_logits_rel_l2": 0.05,
    "engine_hf_rel_l2": 1e-4,  # CPU float32 engine vs the HF model, same weights
}


@dataclasses.dataclass
class Target:
    device: torch.device
    dtype: torch.dtype

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


REF = Target(torch.device("cpu"), torch.float32)


def build_model_dir(out: Path, tiny: bool, seed: int) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    values = {**SMOLLM2_135M, **(TINY if tiny else {})}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**values)).float()
    with torch.no_grad():  # norms are 1.0 at init: perturb them so they matter too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return values


def make_samples(vocab: int, seed: int, big: bool) -> list[Sample]:
    """One GRPO group (shared prompt) per group, plus singletons with their own prompts."""
    rng = random.Random(seed)
    groups, per_group, singles = (8, 8, 16) if big else (2, 3, 3)
    p_len, c_len = ((96, 192), (32, 128)) if big else ((12, 40), (6, 24))
    out: list[Sample] = []

    def sample(prompt: list[int], key: str) -> Sample:
        completion = [rng.randrange(vocab) for _ in range(rng.randint(*c_len))]
        return Sample(
            interaction_id=f"i{len(out)}",
            prompt_ids=prompt,
            completion_ids=completion,
            behav_logprobs=[0.0] * len(completion),
            temperature=rng.choice([1.0, 0.7]),
            reward=rng.random(),
            group_key=key,
            baseline_key="_default",
            advantage=rng.uniform(-1.5, 1.5),
        )

    for g in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(*p_len))]
        out.extend(sample(prompt, f"g{g}") for _ in range(per_group))
    for s in range(singles):
        out.append(sample([rng.randrange(vocab) for _ in range(rng.randint(*p_len))], f"s{s}"))
    return out


def behaviour_noise(s: Sample, gen: torch.Generator) -> torch.Tensor:
    """Per token, log(mu / pi_ref): mostly within +-0.4 (kept by the IcePop band, whose edges
    are +-0.69 nats), 15% at 1.0..1.5 nats either way (masked). No token lies near a band
    edge, so a logprob difference within tolerance cannot flip a token's mask: the step
    comparison measures arithmetic, not that discontinuity."""
    n = len(s.completion_ids)
    near = (torch.rand(n, generator=gen) * 2 - 1) * 0.4
    far = (1.0 + 0.5 * torch.rand(n, generator=gen)) * torch.sign(torch.randn(n, generator=gen))
    return torch.where(torch.rand(n, generator=gen) < 0.15, far, near)


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().float().cpu().reshape(-1) for t in tensors])


def rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm().clamp(min=1e-30))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


class Report:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def check(self, name: str, value: float, limit: float, higher_ok: bool = False) -> None:
        ok = value >= limit if higher_ok else value <= limit
        ok = ok and value == value  # NaN never passes
        rel = ">=" if higher_ok else "<="
        print(f"{'PASS' if ok else 'FAIL'} {name}: {value:.3g} (needs {rel} {limit:g})")
        self.rows.append({"check": name, "value": value, "limit": limit, "ok": ok})

    def info(self, name: str, value: Any) -> None:
        print(f"INFO {name}: {value}")
        self.rows.append({"info": name, "value": value})

    @property
    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if r.get("ok") is False]
