"""Continuous batching of the embedded engine: 16 concurrent requests vs the same 16 serially.

    python bench/engine_batching.py                  # starts an engine subprocess
    python bench/engine_batching.py --url http://127.0.0.1:30000

Every request is greedy with ``ignore_eos`` so both runs produce exactly the same tokens;
the script checks that the outputs are identical and prints both throughputs and their
ratio, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.servers import engine_cmd, free_port, running  # noqa: E402


@contextlib.contextmanager
def started_engine(data_dir: str, slots: int, *extra: str) -> Iterator[str]:
    """The URL of an engine subprocess with ``slots`` running requests and ``extra``
    options (its log in a temporary folder, printed if it fails to start)."""
    port = free_port()
    options = ("--max-running-requests", str(slots), "--context-length", "1024", *extra)
    cmd = engine_cmd(port, *options, data_dir=Path(data_dir))
    log = Path(tempfile.mkdtemp(prefix="rlgate-bench-")) / "engine.log"
    with running(cmd, {}, log, port, timeout=300) as proc:
        yield proc.url


def _prompts(n: int) -> list[list[int]]:
    # Distinct short prompts of plain token ids (no tokenizer needed on the client).
    return [[1, 9690, 198, 2683 + i, 359, 253, 5356 + 7 * i, 5646, 2, 198] for i in range(n)]


def _body(ids: list[int], max_new_tokens: int) -> dict[str, Any]:
    return {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    }


def _run(
    client: httpx.Client, prompts: list[list[int]], max_new_tokens: int, concurrent: bool
) -> tuple[float, list[list[int]]]:
    def one(ids: list[int]) -> list[int]:
        r = client.post("/generate", json=_body(ids, max_new_tokens))
        r.raise_for_status()
        return list(r.json()["output_ids"])

    started = time.perf_counter()
    if concurrent:
        with ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(one, prompts))
    else:
        outputs = [one(ids) for ids in prompts]
    return time.perf_counter() - started, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use a running engine instead of starting one")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("RLGATE_DATA_DIR", "./rlgate-data"),
        help="model cache of the started engine",
    )
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(started_engine(args.data_dir, args.requests))
        with httpx.Client(base_url=url, timeout=600) as client:
            prompts = _prompts(args.requests)
            _run(client, prompts[:2], 4, concurrent=True)  # warm-up
            serial_s, serial_out = _run(client, prompts, args.max_new_tokens, concurrent=False)
            batch_s, batch_out = _run(client, prompts, args.max_new_tokens, concurrent=True)
    tokens = args.requests * args.max_new_tokens
    if serial_out != batch_out:
        print("WARNING: concurrent outputs differ from serial outputs")
    print(f"requests: {args.requests}, max_new_tokens: {args.max_new_tokens} (greedy, ignore_eos)")
    print(f"serial:     {serial_s:7.2f} s  {tokens / serial_s:8.1f} tokens/s")
    print(f"concurrent: {batch_s:7.2f} s  {tokens / batch_s:8.1f} tokens/s")
    print(f"speed-up (concurrent / serial throughput): {serial_s / batch_s:.2f}x")


if __name__ == "__main__":
    main()
