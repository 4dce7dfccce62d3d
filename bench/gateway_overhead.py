"""Proxy overhead: the stub upstream directly vs through rlgate vs through LiteLLM's proxy.

All three paths hit the same fast stub upstream (bench/stub_upstream.py: it answers at
once, so model time is removed and what remains is each proxy's own cost). rlgate does
its full work: auth, chat-template rendering and tokenization, session stitching, and
durable recording (spool append + batched database writes), measured in both spool
modes: the default (the record is in the spool file before the response is sent) and
RLGATE_SPOOL_FSYNC=true (also fdatasync'ed). A third rlgate runs with
RLGATE_COMMIT_WAIT_S=0: an answer is sent without waiting for its records' commit, so the
difference to the default is the price of read-after-write (docs/gateway.md). Printed:
added latency (p50/p99 over sequential requests, minus the direct path) and max
requests/s under concurrency (``--generator-procs`` processes share the load, so one
Python generator does not cap it), each rlgate's share of the direct path, measured side
by side in one run.

    .venv/bin/python bench/gateway_overhead.py [--litellm PATH_TO_litellm_CLI]

LiteLLM's proxy needs `litellm[proxy]` (see bench/README.md); without it that column is
skipped and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
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


def throughput(url: str, headers: dict[str, str], n: int, concurrency: int, procs: int) -> float:
    """Requests/s of ``n`` requests at ``concurrency``, from ``procs`` processes at once
    (each sends its share at its share of the concurrency): total requests over the span
    from the first start to the last end."""
    if procs <= 1:
        return n / asyncio.run(_timed(url, headers, n, concurrency))[1]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        parts = pool.starmap(
            _timed_sync,
            [(url, headers, n // procs, max(1, concurrency // procs)) for _ in range(procs)],
        )
    start = min(p[0] for p in parts)
    end = max(p[0] + p[1] for p in parts)
    return (n // procs) * procs / (end - start)


def _timed_sync(url: str, headers: dict[str, str], n: int, concurrency: int) -> tuple[float, float]:
    try:
        return asyncio.run(_timed(url, headers, n, concurrency))
    except Exception as e:  # httpx's errors do not unpickle in the parent: a plain one does
        raise RuntimeError(f"{type(e).__name__}: {e}") from None


async def _timed(
    url: str, headers: dict[str, str], n: int, concurrency: int
) -> tuple[float, float]:
    """(wall-clock start, seconds) of ``n`` requests at ``concurrency``, after a warm-up."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                r = await c.post(url, json=BODY, headers=headers)
                r.raise_for_status()

        await asyncio.gather(*[one() for _ in range(concurrency)])  # warm up
        start, t = time.time(), time.perf_counter()
        await asyncio.gather(*[one() for _ in range(n)])
        return start, time.perf_counter() - t


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    ap.add_argument("--load", type=int, default=1000, help="requests in the throughput run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--litellm", default=shutil.which("litellm"), help="litellm CLI (proxy)")
    ap.add_argument(
        "--generator-procs", type=int, default=1, help="load generator processes (throughput)"
    )
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
        def start_rlgate(
            sub: str, fsync: bool, commit_wait: bool = True
        ) -> tuple[subprocess.Popen, str, str, Path]:
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
                # the per-key rate limit (100/s by default) would measure itself, not rlgate
                "RLGATE_RATE_LIMIT_RPS": "1000000",
                "RLGATE_RATE_LIMIT_BURST": "1000000",
                "RLGATE_SPOOL_FSYNC": str(fsync).lower(),
                **({} if commit_wait else {"RLGATE_COMMIT_WAIT_S": "0"}),
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
        _, nw_url, nw_key, db_nowait = start_rlgate("nowait", fsync=False, commit_wait=False)

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
            "rlgate-nowait": (
                nw_url + "/v1/chat/completions",
                {"Authorization": f"Bearer {nw_key}"},
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

        print(f"1-min load average before: {os.getloadavg()[0]:.2f}", flush=True)
        lat, rps = {}, {}
        for name, (url, headers) in paths.items():
            lat[name] = sequential(url, headers, args.requests)
            rps[name] = throughput(url, headers, args.load, args.concurrency, args.generator_procs)
            print(
                f"{name:13s} p50 {1000 * statistics.median(lat[name]):7.2f} ms   "
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
                f"  {name:13s} +{1000 * (statistics.median(lat[name]) - base50):6.2f} ms / "
                f"+{1000 * (pct(lat[name], 0.99) - base99):6.2f} ms   "
                f"req/s {100 * rps[name] / rps['direct']:3.0f}% of the direct path's"
                + ("   (target >= 80%)" if name.startswith("rlgate") else "")
            )
        wait_ms = 1000 * (
            statistics.median(lat["rlgate"]) - statistics.median(lat["rlgate-nowait"])
        )
        print(
            f"\nread-after-write (commit wait on vs off): {wait_ms:+.2f} ms p50 at concurrency 1, "
            f"{rps['rlgate'] / rps['rlgate-nowait']:.2f}x req/s at concurrency {args.concurrency}"
        )
        if "litellm" in paths:
            added_ll = statistics.median(lat["litellm"]) - base50
            for name in ("rlgate", "rlgate+fsync"):
                added = statistics.median(lat[name]) - base50
                print(
                    f"\n{name} added p50 / LiteLLM added p50: {added / added_ll:.2f}"
                    "   (target <= 0.17, one sixth)"
                )
                print(
                    f"{name} req/s / LiteLLM req/s:         {rps[name] / rps['litellm']:.2f}"
                    "   (target >= 3)"
                )
        print(f"1-min load average after: {os.getloadavg()[0]:.2f}")
        # everything rlgate acknowledged was recorded
        time.sleep(1.0)
        import sqlite3

        procs = max(1, args.generator_procs)
        warm = args.concurrency if procs == 1 else max(1, args.concurrency // procs) * procs
        sent = 10 + args.requests + warm + (args.load // procs) * procs
        dbs = (("rlgate", db_default), ("rlgate+fsync", db_fsync), ("rlgate-nowait", db_nowait))
        for name, db in dbs:
            n_rec = sqlite3.connect(db).execute("select count(*) from interactions").fetchone()[0]
            print(f"{name} recorded {n_rec} of {sent} requests")
    finally:
        ps.close()


if __name__ == "__main__":
    main()
