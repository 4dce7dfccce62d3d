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
Run it through ``scripts/device_check.sh`` (docs/trainer.md, "GPU check"). The model, the
batch, the tolerances and the report are in ``scripts/device_check_common.py``.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_check_common import (  # noqa: E402
    REF,
    TOL,
    Report,
    Target,
    behaviour_noise,
    build_model_dir,
    cosine,
    flat,
    make_samples,
    rel_l2,
)

from engine.llama import KVCache, LlamaModel  # noqa: E402
from trainer import policy as policy_mod  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.policy import Policy, make_micro_batches  # noqa: E402
from trainer.train import train  # noqa: E402


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
