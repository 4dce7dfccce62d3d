"""Trainer throughput: length-bucketed micro-batches + LM head only at sampled positions (rlgate)
vs a naive padded PEFT loop (pad to the longest, full-vocab log_softmax everywhere), on the
same batch, same model, same loss. Prints tokens/s of both and the ratio.

    .venv/bin/python bench/trainer_throughput.py [--samples 24] [--iters 2]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model_files import PACKAGED_MODEL, resolve_model_dir  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import Sample  # noqa: E402
from trainer.loss import ppo_loss, token_logprobs  # noqa: E402
from trainer.policy import Policy  # noqa: E402
from trainer.train import train  # noqa: E402


def batch(n: int, seed: int = 0, group: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    prompt: list[int] = []
    for i in range(n):  # agent-like: long prompts of varied length, short answers
        if i % group == 0:  # samples of one group (an n > 1 request) share the prompt
            prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(32, 192))]
        c = rng.randint(8, 48)
        out.append(
            Sample(
                f"s{i}",
                prompt,
                [rng.randrange(100, 40000) for _ in range(c)],
                [-2.0] * c,
                1.0,
                rng.choice([1.0, -1.0]),
                f"g{i // 2}",
                "t",
                advantage=rng.choice([1.0, -1.0]),
            )
        )
    return out


def naive_step(policy: Policy, opt, samples: list[Sample], cfg: TrainConfig, bs: int) -> None:  # type: ignore[no-untyped-def]
    model, loss_cfg = policy.model, cfg  # a TrainConfig is the LossConfig
    n_tok = float(sum(len(s.completion_ids) for s in samples))
    opt.zero_grad()
    for i in range(0, len(samples), bs):
        chunk = samples[i : i + bs]
        width = max(s.length for s in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        att = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width - 1, dtype=torch.bool)
        for r, s in enumerate(chunk):
            seq = s.prompt_ids + s.completion_ids
            ids[r, : len(seq)] = torch.tensor(seq)
            att[r, : len(seq)] = 1
            mask[r, len(s.prompt_ids) - 1 : len(seq) - 1] = True
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        temps = torch.ones(len(chunk), width - 1)
        logp = token_logprobs(logits, ids[:, 1:], temps)
        with torch.no_grad():
            prox = logp.detach()
        loss, _ = ppo_loss(
            logp,
            prox,
            prox,
            torch.tensor([s.advantage for s in chunk]),
            mask,
            loss_cfg,
            num_tokens=n_tok,
        )
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.params, cfg.max_grad_norm)
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--naive-batch", type=int, default=4)
    ap.add_argument("--group", type=int, default=1, help="samples per shared prompt (GRPO n)")
    ap.add_argument(
        "--data-dir", default=os.environ.get("RLGATE_ENGINE_TEST_CACHE", "/tmp/rlgate-engine-cache")
    )
    a = ap.parse_args()
    model_dir = resolve_model_dir(PACKAGED_MODEL, Path(a.data_dir))
    cfg = TrainConfig(micro_batch_tokens=2048, lora_rank=8, num_minibatches=1)
    samples = batch(a.samples, group=a.group)
    tokens = sum(s.length for s in samples)
    policy = Policy.load(model_dir, cfg)
    opt = policy.make_optimizer(cfg, None)
    naive_step(policy, opt, samples[:2], cfg, a.naive_batch)  # warm-up
    results = {}
    for name in ("naive padded PEFT", "rlgate bucketed"):
        t0 = time.perf_counter()
        for _ in range(a.iters):
            if name.startswith("naive"):
                naive_step(policy, opt, samples, cfg, a.naive_batch)
            else:  # the real loop: includes recomputing proximal logprobs (an extra forward)
                train(policy, opt, samples, cfg, progress=False)
        dt = time.perf_counter() - t0
        results[name] = tokens * a.iters / dt
        print(f"{name:<20} {results[name]:8.0f} tokens/s  ({dt:.1f} s, {a.iters} steps)")
    pad = sum(
        max(s.length for s in samples[i : i + a.naive_batch]) * len(samples[i : i + a.naive_batch])
        for i in range(0, len(samples), a.naive_batch)
    )
    print(
        f"batch: {len(samples)} samples, {tokens} tokens ({pad} padded in the naive loop), "
        f"threads={torch.get_num_threads()}"
    )
    print(
        f"speedup: {results['rlgate bucketed'] / results['naive padded PEFT']:.2f}x"
        " (target >= 1.5x)"
    )


if __name__ == "__main__":
    main()
