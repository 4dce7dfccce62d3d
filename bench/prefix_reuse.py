"""Prefix reuse in the embedded engine: the demo's workload with and without it.

    python bench/prefix_reuse.py [--questions 48] [--group 4] [--threads 1]

The workload is `rlgate demo`'s: short chat prompts ("What is a + b? Reply with only the
number.") that share the chat template's system prompt, each sampled ``--group`` times
(``n``), 8 new tokens, 16 sequences in flight. Two engines are started one after the
other, one with ``--disable-prefix-reuse``; the script prints answers/s of both and the
ratio, and how many prompt tokens the reusing engine copied instead of recomputing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_batching import started_engine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _prompts(data_dir: str, questions: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from core.settings import PACKAGED_MODEL
    from engine.model_files import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(PACKAGED_MODEL, Path(data_dir))))
    out = []
    for i in range(questions):
        a, b = 1 + i % 20, 1 + (7 * i) % 20
        msg = [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}]
        out.append(
            list(
                tok.apply_chat_template(
                    msg, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        )
    return out


async def _workload(url: str, prompts: list[list[int]], group: int, in_flight: int) -> float:
    sem = asyncio.Semaphore(max(1, in_flight // group))
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(i: int, ids: list[int]) -> None:
            async with sem:
                r = await client.post(
                    "/generate",
                    json={
                        "input_ids": ids,
                        "sampling_params": {
                            "temperature": 1.0,
                            "max_new_tokens": 8,
                            "n": group,
                            "seed": i,
                            "ignore_eos": True,
                        },
                    },
                )
                r.raise_for_status()

        await one(0, prompts[0])  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="engine torch threads")
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("RLGATE_DATA_DIR", "./rlgate-data"),
        help="model cache of the started engines",
    )
    args = parser.parse_args()
    prompts = _prompts(args.data_dir, args.questions)
    answers = args.questions * args.group
    results: dict[str, float] = {}
    reused = 0
    for label, extra in (("full prefill", ("--disable-prefix-reuse",)), ("prefix reuse", ())):
        options = (*extra, "--num-threads", str(args.threads))
        with started_engine(args.data_dir, args.in_flight, *options) as url:
            results[label] = asyncio.run(_workload(url, prompts, args.group, args.in_flight))
            reused = httpx.get(url + "/get_server_info").json()["prefix_reused_tokens"]
    print(
        f"{args.questions} prompts x n={args.group}, 8 tokens each, {args.in_flight} in "
        f"flight, {args.threads} engine thread(s); prompt {len(prompts[0])} tokens"
    )
    for label, seconds in results.items():
        print(f"{label:13s} {seconds:7.2f} s  {answers / seconds:7.1f} answers/s")
    print(f"prompt tokens copied instead of recomputed (reuse run): {reused}")
    print(
        f"speed-up (reuse / full prefill): {results['full prefill'] / results['prefix reuse']:.2f}x"
    )


if __name__ == "__main__":
    main()
