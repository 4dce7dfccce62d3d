"""Cross-row shared prefix: a training forward + backward over synthetic rows that share a
~500-token prefix (a system prompt with tool specs) and differ after it, with the shared
prefix forwarded once (on) vs every row forwarding it (off), alternated in one process.

    python bench/shared_prefix.py [--rows 32] [--prefix 500] [--budget 8192] [--pairs 2]

The packaged model (SmolLM2-135M) with a seeded LoRA adapter, float32 on CPU (bfloat16 on
CUDA). Rows: the prefix, a 20-80-token question, a 5-30-token completion (random ids).
Micro-batches as a training step makes them (trainer/forward.py, ``micro_batch_tokens``
= ``--budget``). Printed per mode: micro-batches, tokens forwarded (padding aside),
padded tokens, wall time of the forward + backward over all micro-batches (median of
``--pairs``), and the largest logprob difference between the modes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.model_files import PACKAGED_MODEL, resolve_model_dir  # noqa: E402
from tests.servers import MODEL_CACHE  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import Sample  # noqa: E402
from trainer.policy import Policy, make_micro_batches  # noqa: E402

OFF = 10**9


def rows(n: int, prefix: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    ids = lambda k: [rng.randrange(100, 40000) for _ in range(k)]  # noqa: E731
    system = ids(prefix)
    out = []
    for i in range(n):
        c = ids(rng.randint(5, 30))
        prompt = system + ids(rng.randint(20, 80))
        out.append(Sample(f"r{i}", prompt, c, [-1.0] * len(c), 1.0, 0.0, f"r{i}", "t",
                          advantage=rng.uniform(-1, 1)))  # fmt: skip
    return out


def step(policy: Policy, samples: list[Sample], budget: int, min_prefix: int) -> dict:
    batches = make_micro_batches(samples, budget, min_prefix=min_prefix)
    policy.model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    lps = {}
    for b in batches:
        lp = policy.batch_logprobs(b)
        sum((x * s.advantage).sum() for x, s in zip(lp, b.samples, strict=True)).backward()
        lps.update({s.interaction_id: x.detach() for s, x in zip(b.samples, lp, strict=True)})
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {
        "seconds": time.perf_counter() - t,
        "batches": len(batches),
        "forward_tokens": sum(b.forward_tokens for b in batches),
        "padded_tokens": sum(b.padded_tokens for b in batches),
        "lps": lps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=500)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    policy = Policy.load(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE), TrainConfig(lora_rank=8))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    samples = rows(args.rows, args.prefix)
    step(policy, samples[:4], args.budget, OFF)  # warm-up
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.pairs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            runs[mode].append(step(policy, samples, args.budget, 16 if mode == "on" else OFF))
    for mode, rs in runs.items():
        r = rs[0]
        secs = statistics.median(x["seconds"] for x in rs)
        print(f"{mode:>3}: {r['batches']:>3} micro-batches  {r['forward_tokens']:>8,} tokens "
              f"forwarded  {r['padded_tokens']:>8,} padded  {secs:7.2f} s fwd+bwd")  # fmt: skip
    on, off = runs["on"][0], runs["off"][0]
    diff = max((on["lps"][k] - off["lps"][k]).abs().max().item() for k in on["lps"])
    t_on = statistics.median(x["seconds"] for x in runs["on"])
    t_off = statistics.median(x["seconds"] for x in runs["off"])
    print(f"tokens {off['forward_tokens'] / on['forward_tokens']:.2f}x fewer, "
          f"{t_off / t_on:.2f}x faster; max logprob diff {diff:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
