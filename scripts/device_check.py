"""GPU path check: the trainer's and the engine's accelerator path against CPU float32.

Builds a Llama with the packaged SmolLM2-135M-Instruct's architecture (its config.json
values are below; ``--tiny`` shrinks it) and RANDOM, seeded weights, so nothing has to be
downloaded or converted, writes it to a temporary HF directory, then checks:

1. trainer: ``trainer.policy.Policy.load`` + ``trainer.train.train`` (the real code path,
   one PPO step with KL and entropy terms on a synthetic batch that has both a shared-prompt
   GRPO group and distinct prompts) on the target (CUDA bfloat16; ``--cpu-only``: CPU
   bfloat16) against CPU float32: per-token logprobs (adapter on and off), the step's loss,
   the LoRA gradients and the LoRA weights after the AdamW step.
2. engine: ``engine.llama.LlamaModel`` prefill + decode logits on the target against CPU
   float32. The engine is CPU-only (it has no device setting): for CUDA this check moves
   its tensors to the GPU and runs it under ``torch.device("cuda")`` as the default device.
   The CPU float32 engine is also compared with the HF model (the trainer's forward).
3. speed: tokens/s of a warm trainer step and of a no-gradient forward on the target.

``Policy.load`` picks its device itself (CUDA bfloat16 when there is a GPU); to load the
same weights on both sides this script pins ``trainer.policy.pick_device`` per load.
Prints one PASS/FAIL line per check and a summary; exits 1 on any FAIL.
Run it through ``scripts/device_check.sh`` (docs/trainer.md, "GPU check").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.llama import KVCache, LlamaModel  # noqa: E402
from trainer import policy as policy_mod  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import Sample  # noqa: E402
from trainer.policy import Policy, make_micro_batches  # noqa: E402
from trainer.train import train  # noqa: E402

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


def load_policy(model_dir: Path, cfg: TrainConfig, t: Target) -> Policy:
    with mock.patch.object(policy_mod, "pick_device", return_value=(t.device, t.dtype)):
        return Policy.load(model_dir, cfg)


def randomize_lora(policies: list[Policy], seed: int) -> None:
    """Same random LoRA A and B in every policy (B is zero at init: no A gradient)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in zip(policies[0].param_names, policies[0].params, strict=True):
        value = torch.randn(p.shape, generator=gen) * (0.02 if "lora_B" in name else 0.05)
        for pol in policies:
            dict(zip(pol.param_names, pol.params, strict=True))[name].data.copy_(value)


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


def check_trainer(model_dir: Path, t: Target, rep: Report, seed: int, vocab: int) -> None:
    cfg = TrainConfig(
        lora_dropout=0.0,
        kl_coef=0.05,
        entropy_coef=0.01,
        kl_prox_target=None,
        lr=1e-3,
        epochs=1,
        num_minibatches=1,
        micro_batch_tokens=256,
        seed=seed,
    )
    cfg.check()
    ref, tgt = load_policy(model_dir, cfg, REF), load_policy(model_dir, cfg, t)
    randomize_lora([ref, tgt], seed)
    samples = make_samples(vocab, seed, big=False)
    batches = make_micro_batches(samples, cfg.micro_batch_tokens)
    rep.info(
        "trainer micro-batches (shared-prompt, padded)",
        (sum(b.shares_prompts for b in batches), sum(not b.shares_prompts for b in batches)),
    )
    lp_ref, lp_tgt = ref.logprobs(batches), tgt.logprobs(batches)
    base_ref = ref.logprobs(batches, adapter=False)
    base_tgt = tgt.logprobs(batches, adapter=False)
    gen = torch.Generator().manual_seed(seed + 1)
    for s in samples:  # recorded behaviour logprobs: the reference's plus noise
        s.behav_logprobs = (lp_ref[s.interaction_id] + behaviour_noise(s, gen)).tolist()
    ids = [s.interaction_id for s in samples]
    d_lp = flat([lp_tgt[i] for i in ids]) - flat([lp_ref[i] for i in ids])
    d_base = flat([base_tgt[i] for i in ids]) - flat([base_ref[i] for i in ids])
    rep.info("logprob std over tokens (reference)", f"{flat([lp_ref[i] for i in ids]).std():.3f}")
    rep.check(
        "trainer logprobs max |diff| (adapter on)", float(d_lp.abs().max()), TOL["logprob_max_abs"]
    )
    rep.check(
        "trainer logprobs mean |diff| (adapter on)",
        float(d_lp.abs().mean()),
        TOL["logprob_mean_abs"],
    )
    rep.check(
        "trainer logprobs max |diff| (adapter off)",
        float(d_base.abs().max()),
        TOL["logprob_max_abs"],
    )

    results = []
    for pol in (ref, tgt):
        before = flat(pol.params)
        opt = pol.make_optimizer(cfg, None)
        steps = train(pol, opt, [dataclasses.replace(s) for s in samples], cfg, progress=False)
        grads = flat([p.grad for p in pol.params])
        results.append((steps[0], grads, flat(pol.params) - before))
    (m_ref, g_ref, u_ref), (m_tgt, g_tgt, u_tgt) = results
    rep.info("trainer loss (ref, target)", f"{m_ref['loss']:.5f}, {m_tgt['loss']:.5f}")
    rep.check("trainer loss |diff|", abs(m_tgt["loss"] - m_ref["loss"]), TOL["loss_abs"])
    rep.check("trainer LoRA gradient rel L2", rel_l2(g_tgt, g_ref), TOL["grad_rel_l2"])
    rep.check("trainer LoRA update cosine", cosine(u_tgt, u_ref), TOL["update_cos"], True)
    rep.info(
        "trainer grad_norm (ref, target)", f"{m_ref['grad_norm']:.4g}, {m_tgt['grad_norm']:.4g}"
    )


def _engine_to(model: LlamaModel, device: torch.device) -> None:
    """Move the (CPU-only) engine's tensors to ``device``: a check-only helper."""
    model.embed = model.embed.to(device)
    model.lm_head = model.embed if model.cfg.tie_word_embeddings else model.lm_head.to(device)
    model.inv_freq = model.inv_freq.to(device)
    for norm in [model.norm, *model.input_norms, *model.post_norms]:
        norm.weight = norm.weight.to(device)
    model.layers = [{k: w.to(device) for k, w in layer.items()} for layer in model.layers]


def engine_logits(model_dir: Path, t: Target, prompts: list[list[int]], steps: int) -> torch.Tensor:
    """Prefill ``prompts`` (one slot each), then ``steps`` decode steps fed fixed tokens."""
    model = LlamaModel(model_dir, dtype=t.dtype)
    _engine_to(model, t.device)
    with torch.device(t.device):
        cache = KVCache(model.cfg, len(prompts), max(map(len, prompts)) + steps + 1, t.dtype)
        outs = [model.prefill_batch([(p, i, 0) for i, p in enumerate(prompts)], cache, None)]
        pos = torch.tensor([len(p) for p in prompts])
        for step in range(steps):
            tokens = torch.tensor(
                [(7 * step + 3 * i + 1) % model.cfg.vocab_size for i in range(len(prompts))]
            )
            outs.append(model.decode(tokens, pos, cache, None))
            pos = pos + 1
    return torch.stack([o.float().cpu() for o in outs])


def check_engine(model_dir: Path, t: Target, rep: Report, seed: int, vocab: int) -> None:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (17, 33, 9)]
    ref = engine_logits(model_dir, REF, prompts, steps=4)
    tgt = engine_logits(model_dir, t, prompts, steps=4)
    rep.check(
        "engine logits rel L2 (prefill + 4 decode steps)",
        rel_l2(tgt, ref),
        TOL["engine_logits_rel_l2"],
    )
    rep.info(
        "engine argmax agreement", f"{float((tgt.argmax(-1) == ref.argmax(-1)).float().mean()):.3f}"
    )
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        hf_last = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
    rep.check(
        "engine CPU float32 vs HF forward rel L2", rel_l2(ref[0], hf_last), TOL["engine_hf_rel_l2"]
    )


def _median_time(fn: Any, t: Target, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t.sync()
        started = time.perf_counter()
        fn()
        t.sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def check_speed(model_dir: Path, t: Target, rep: Report, seed: int, vocab: int, big: bool) -> None:
    cfg = TrainConfig(lora_dropout=0.0, kl_prox_target=None, epochs=1, num_minibatches=1, seed=seed)
    pol = load_policy(model_dir, cfg, t)
    samples = make_samples(vocab, seed + 2, big=big)
    tokens = sum(s.length for s in samples)
    opt = pol.make_optimizer(cfg, None)

    def step() -> None:
        train(pol, opt, samples, cfg, progress=False)

    step()  # warm-up: kernels, allocator, cuBLAS handles
    secs = _median_time(step, t, repeat=3)
    rep.info(
        "trainer step tokens/s",
        f"{tokens / secs:,.0f} ({len(samples)} samples, "
        f"{tokens} tokens, {secs * 1e3:.1f} ms median of 3)",
    )
    rows, width = (16, 512) if big else (2, 64)
    ids = torch.randint(0, vocab, (rows, width), generator=torch.Generator().manual_seed(seed))
    ids = ids.to(t.device)
    pol.model.eval()

    @torch.no_grad()
    def forward() -> None:
        pol.model(input_ids=ids)

    forward()
    secs = _median_time(forward, t, repeat=5)
    rep.info(
        "forward tokens/s (no grad, LoRA on)",
        f"{rows * width / secs:,.0f} ({rows}x{width}, {secs * 1e3:.1f} ms median of 5)",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cpu-only",
        action="store_true",
        help="target = CPU bfloat16 (the default is CUDA bfloat16 when a GPU is "
        "visible, else CPU bfloat16)",
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="a 2-layer, 64-wide model with the same architecture (fast on CPU)",
    )
    ap.add_argument(
        "--only",
        default="trainer,engine,speed",
        help="comma-separated sections to run (default: all three)",
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    use_cuda = torch.cuda.is_available() and not args.cpu_only
    t = Target(torch.device("cuda" if use_cuda else "cpu"), torch.bfloat16)
    rep = Report()
    print(f"target: {t.device} {t.dtype} vs reference: cpu float32; torch {torch.__version__}")
    if use_cuda:
        rep.info("gpu", torch.cuda.get_device_name(0))
    else:
        print("no GPU in use: CPU bfloat16 vs CPU float32 (the same code paths)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlgate-device-check-") as tmp:
        values = build_model_dir(Path(tmp), args.tiny, args.seed)
        rep.info(
            "model",
            f"SmolLM2-135M architecture{' (tiny)' if args.tiny else ''}, "
            f"{values['num_hidden_layers']} layers, random weights (seed {args.seed})",
        )
        sections = [
            ("trainer", lambda: check_trainer(Path(tmp), t, rep, args.seed, values["vocab_size"])),
            ("engine", lambda: check_engine(Path(tmp), t, rep, args.seed, values["vocab_size"])),
            (
                "speed",
                lambda: check_speed(
                    Path(tmp),
                    t,
                    rep,
                    args.seed,
                    values["vocab_size"],
                    big=use_cuda and not args.tiny,
                ),
            ),
        ]
        for name, run in sections:
            if name not in args.only.split(","):
                continue
            print(f"-- {name}", flush=True)
            try:
                run()
            except Exception as exc:  # a crash is a FAIL of that section, not a traceback
                print(f"FAIL {name}: {type(exc).__name__}: {exc}")
                rep.rows.append({"check": name, "ok": False, "error": repr(exc)})
    failed = rep.failed
    n = sum(1 for r in rep.rows if "ok" in r)
    print(
        f"SUMMARY: {n - len(failed)}/{n} checks passed on {t.device} {t.dtype} "
        f"in {time.perf_counter() - started:.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"target": str(t.device), "rows": rep.rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
