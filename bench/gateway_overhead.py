"""Proxy overhead: the stub upstream directly vs through rlgate vs through LiteLLM's proxy.

All three paths hit the same fast stub upstream (bench/stub_upstream.py: it answers at
once, so model time is removed and what remains is each proxy's own cost). rlgate does
its full work: auth, chat-template rendering and tokenization, session stitching, and
durable recording (spool append + batched database writes), measured in both spool
modes: the default (the record is in the spool file before the response is sent) and
RLGATE_SPOOL_FSYNC=true (also fdatasync'ed). Printed: added latency
(p50/p99 over sequential requests, minus the direct path) and max requests/s under
concurrency, measured side by side in one run.

    .venv/bin/python bench/gateway_overhead.py [--litellm PATH_TO_litellm_CLI]

LiteLLM's proxy needs `litellm[proxy]` (see bench/README.md); without it that column is
skipped and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stub_stack import Procs, wait_up  # noqa: E402
from tests.servers import MODEL_CACHE, free_port  # noqa: E402

BODY = {"model": "stub", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}


def sequential(url: str, headers: dict[str, str], n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=30) as c:
        for _ in range(10):  # warm up
            c.post(url, json=BODY, headers=headers).raise_for_status()
        for _ in range(n):
            t = time.perf_counter()
            c.post(url, json=BODY, headers=headers).raise_for_status()
            out.append(time.perf_counter() - t)
    return out


async def throughput(url: str, headers: dict[str, str], n: int, concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                r = await c.post(url, json=BODY, headers=headers)
                r.raise_for_status()

        await asyncio.gather(*[one() for _ in range(concurrency)])  # warm up
        t = time.perf_counter()
        await asyncio.gather(*[one() for _ in range(n)])
        return n / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    ap.add_argument("--load", type=int, default=1000, help="requests in the throughput run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--litellm", default=shutil.which("litellm"), help="litellm CLI (proxy)")
    args = ap.parse_args()

    ps = Procs("rlgate-bench-")
    tmp, env, spawn = ps.tmp, ps.env, ps.spawn

    try:
        from engine.model_files import PACKAGED_MODEL, resolve_model_dir

        model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
        stub_url = ps.stub(free_port())

        # rlgate, recording into SQLite (the embedded default), in both spool modes: the
        # default (records written to the spool file before the response: survives a crash)
        # and RLGATE_SPOOL_FSYNC=true (also fdatasync'ed: survives power loss)
        def start_rlgate(sub: str, fsync: bool) -> tuple[subprocess.Popen, str, str, Path]:
            (tmp / sub).mkdir()
            db = tmp / sub / "rlgate.db"
            gw_env = {
                "RLGATE_DATA_DIR": str(tmp / sub),
                "RLGATE_DATABASE_URL": f"sqlite:///{db}",
                "RLGATE_ENGINE_URLS": stub_url,
                "RLGATE_TOKENIZER_PATH": str(model_dir),
                "RLGATE_LOG_LEVEL": "warning",
                "RLGATE_MAX_IN_FLIGHT_PER_ENGINE": "256",
                "RLGATE_MAX_CONCURRENT_PER_KEY": "256",
                "RLGATE_SPOOL_FSYNC": str(fsync).lower(),
            }
            subprocess.run(
                [sys.executable, "-m", "rlgate.cli", "migrate"],
                env={**env, **gw_env},
                check=True,
                capture_output=True,
            )
            key = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rlgate.cli",
                    "keys",
                    "create",
                    "--project",
                    "bench",
                    "--kind",
                    "agent",
                ],
                env={**env, **gw_env},
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            port = free_port()
            proc = spawn(
                [sys.executable, "-m", "rlgate.cli", "gateway", "--port", str(port)],
                f"gateway-{sub}.log",
                gw_env,
            )
            url = f"http://127.0.0.1:{port}"
            wait_up(url + "/health", proc)
            return proc, url, key, db

        gw, gw_url, key, db_default = start_rlgate("default", fsync=False)
        _, fs_url, fs_key, db_fsync = start_rlgate("fsync", fsync=True)

        if os.environ.get("RLGATE_BENCH_PROFILE"):
            subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-o",
                    os.environ["RLGATE_BENCH_PROFILE"],
                    "--format",
                    "speedscope",
                    "-d",
                    "25",
                    "-p",
                    str(gw.pid),
                    "--idle",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        paths = {
            "direct": (stub_url + "/v1/chat/completions", {}),
            "rlgate": (gw_url + "/v1/chat/completions", {"Authorization": f"Bearer {key}"}),
            "rlgate+fsync": (
                fs_url + "/v1/chat/completions",
                {"Authorization": f"Bearer {fs_key}"},
            ),
        }
        if args.litellm:
            cfg = tmp / "litellm.yaml"
            cfg.write_text(
                "model_list:\n  - model_name: stub\n    litellm_params:\n"
                f"      model: openai/stub\n      api_base: {stub_url}/v1\n"
                "      api_key: sk-stub\n"
                # both proxies authenticate every request
                "general_settings:\n  master_key: sk-bench-master-key-0123456789abcdef\n"
            )
            ll_port = free_port()
            ll = spawn(
                [args.litellm, "--config", str(cfg), "--port", str(ll_port), "--num_workers", "1"],
                "litellm.log",
                {"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )  # no network fetch
            wait_up(f"http://127.0.0.1:{ll_port}/health/liveliness", ll, 180)
            paths["litellm"] = (
                f"http://127.0.0.1:{ll_port}/v1/chat/completions",
                {"Authorization": "Bearer sk-bench-master-key-0123456789abcdef"},
            )
        else:
            print("LiteLLM proxy: not installed (pip install -r bench/requirements.txt); skipped")

        lat, rps = {}, {}
        for name, (url, headers) in paths.items():
            lat[name] = sequential(url, headers, args.requests)
            rps[name] = asyncio.run(throughput(url, headers, args.load, args.concurrency))
            print(
                f"{name:12s} p50 {1000 * statistics.median(lat[name]):7.2f} ms   "
                f"p99 {1000 * pct(lat[name], 0.99):7.2f} ms   {rps[name]:8.1f} req/s",
                flush=True,
            )

        base50 = statistics.median(lat["direct"])
        base99 = pct(lat["direct"], 0.99)
        print("\nadded latency over the direct path (p50 / p99):")
        for name in paths:
            if name == "direct":
                continue
            print(
                f"  {name:12s} +{1000 * (statistics.median(lat[name]) - base50):6.2f} ms / "
                f"+{1000 * (pct(lat[name], 0.99) - base99):6.2f} ms"
            )
        if "litellm" in paths:
            added_ll = statistics.median(lat["litellm"]) - base50
            for name in ("rlgate", "rlgate+fsync"):
                added = statistics.median(lat[name]) - base50
                print(
                    f"\n{name} added p50 / LiteLLM added p50: {added / added_ll:.2f}"
                    "   (target <= 0.33)"
                )
                print(
                    f"{name} req/s / LiteLLM req/s:         {rps[name] / rps['litellm']:.2f}"
                    "   (target >= 3)"
                )
        # everything rlgate acknowledged was recorded
        time.sleep(1.0)
        import sqlite3

        sent = 10 + args.requests + args.concurrency + args.load
        for name, db in (("rlgate", db_default), ("rlgate+fsync", db_fsync)):
            n_rec = sqlite3.connect(db).execute("select count(*) from interactions").fetchone()[0]
            print(f"{name} recorded {n_rec} of {sent} requests")
    finally:
        ps.close()


if __name__ == "__main__":
    main()
