"""Gateway load: many concurrent streaming sessions against rlgate for a fixed time.

Pure gateway load: the upstream is bench/stub_upstream.py speaking SGLang's streaming
``/generate`` (cumulative SSE chunks, ``--token-delay-ms`` between tokens), so what is
measured is the gateway's own work: auth, chat template and tokenization, session
stitching, streaming, and recording every answer (spool + database). Each of
``--sessions`` clients runs a multi-turn conversation (the assistant's answer and a new
user message are appended each turn; a fresh conversation after ``--turns`` turns) with
``stream: true`` until ``--duration`` seconds are over.

Reported: calls finished and failed (by kind), TTFT (first content chunk) and total
latency percentiles, calls/s, the gateway's RSS sampled every ``--rss-every`` seconds,
the load average before and after, and how many answers were recorded in the database.

    .venv/bin/python bench/load_streams.py [--sessions 200] [--duration 300] [--json out.json]

Loopback only; every loop is bounded by ``--duration``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stub_stack import Procs, wait_up  # noqa: E402
from tests.servers import MODEL_CACHE, free_port  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Stats:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.total: list[float] = []
        self.errors: Counter[str] = Counter()
        self.ok = 0


async def session_loop(
    http: aiohttp.ClientSession,
    url: str,
    key: str,
    idx: int,
    turns: int,
    end: float,
    stats: Stats,
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    messages: list[dict[str, str]] = []
    turn = 0
    while time.monotonic() < end:
        if turn % turns == 0:
            messages = [{"role": "user", "content": f"Session {idx}: say hello."}]
        body = {"model": "rlgate-policy", "messages": messages, "stream": True, "max_tokens": 16}
        t0 = time.monotonic()
        ttft = None
        text: list[str] = []
        done = False
        try:
            async with http.post(url, json=body, headers=headers) as r:
                if r.status != 200:
                    stats.errors[f"HTTP {r.status}"] += 1
                    await r.read()
                    await asyncio.sleep(0.5)
                    continue
                async for raw in r.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    for choice in chunk.get("choices", []):
                        piece = choice.get("delta", {}).get("content")
                        if piece:
                            if ttft is None:
                                ttft = time.monotonic() - t0
                            text.append(piece)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            stats.errors[type(e).__name__] += 1
            await asyncio.sleep(0.5)
            continue
        if not done or ttft is None:
            stats.errors["stream ended without [DONE] or content"] += 1
            continue
        stats.ok += 1
        stats.ttft.append(ttft)
        stats.total.append(time.monotonic() - t0)
        turn += 1
        messages = [
            *messages,
            {"role": "assistant", "content": "".join(text)},
            {"role": "user", "content": f"Turn {turn}: again."},
        ]


async def rss_loop(pid: int, every: float, end: float, out: list[tuple[float, float]]) -> None:
    t0 = time.monotonic()
    while True:
        out.append((round(time.monotonic() - t0, 1), round(rss_mib(pid), 1)))
        if time.monotonic() >= end:
            return
        await asyncio.sleep(min(every, max(0.0, end - time.monotonic())))


async def drive(args: argparse.Namespace, url: str, keys: list[str], pid: int) -> dict[str, Any]:
    stats = Stats()
    rss: list[tuple[float, float]] = []
    conn = aiohttp.TCPConnector(limit=args.sessions + 8)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        start = time.monotonic()
        end = start + args.duration
        tasks = [
            session_loop(http, url, keys[i % len(keys)], i, args.turns, end, stats)
            for i in range(args.sessions)
        ]
        await asyncio.gather(rss_loop(pid, args.rss_every, end, rss), *tasks)
        elapsed = time.monotonic() - start
    ms = 1000.0
    return {
        "ok": stats.ok,
        "errors": dict(stats.errors),
        "calls_per_s": round(stats.ok / elapsed, 1),
        "ttft_ms": {
            q: round(pct(stats.ttft, v) * ms, 1)
            for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
        }
        | {"max": round(max(stats.ttft, default=float("nan")) * ms, 1)},
        "total_ms": {
            q: round(pct(stats.total, v) * ms, 1)
            for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
        }
        | {"max": round(max(stats.total, default=float("nan")) * ms, 1)},
        "mean_total_ms": round(statistics.fmean(stats.total) * ms, 1) if stats.total else None,
        "rss_mib": rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=200, help="concurrent streaming sessions")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    ap.add_argument(
        "--sessions-per-key",
        type=int,
        default=25,
        help="sessions sharing one agent key (the per-key limits default to 32 concurrent "
        "calls and 100 requests/s; the load is many agents, not one key over its limit)",
    )
    ap.add_argument("--turns", type=int, default=8, help="turns before a session starts over")
    ap.add_argument("--token-delay-ms", type=float, default=10.0, help="stub: pause per token")
    ap.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--db-url", default=None, help="gateway database (default: SQLite file)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if not (0 < args.duration <= 3600 and 0 < args.sessions <= 2000):
        ap.error("--duration must be in (0, 3600] and --sessions in (0, 2000]")

    # SIGTERM runs the cleanup below too (the stub and the gateway are stopped)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ps = Procs("rlgate-load-")
    tmp, env, spawn = ps.tmp, ps.env, ps.spawn

    try:
        from engine.model_files import PACKAGED_MODEL, resolve_model_dir

        model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
        stub_url = ps.stub(free_port(), "--token-delay-ms", str(args.token_delay_ms))

        db_url = args.db_url or f"sqlite:///{tmp / 'rlgate.db'}"
        gw_env = {
            "RLGATE_DATA_DIR": str(tmp),
            "RLGATE_DATABASE_URL": db_url,
            "RLGATE_ENGINE_URLS": stub_url,
            "RLGATE_TOKENIZER_PATH": str(model_dir),
            "RLGATE_LOG_LEVEL": "warning",
            "RLGATE_MAX_IN_FLIGHT_PER_ENGINE": str(args.sessions + 16),
        }
        cli = [sys.executable, "-m", "rlgate.cli"]
        genv = {**env, **gw_env}
        subprocess.run([*cli, "migrate"], env=genv, check=True, capture_output=True)
        keys = [
            subprocess.run(
                [*cli, "keys", "create", "--project", "bench", "--kind", "agent"],
                env=genv,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            for _ in range(max(1, -(-args.sessions // args.sessions_per_key)))
        ]
        port = free_port()
        gw = spawn([*cli, "gateway", "--port", str(port)], "gateway.log", gw_env)
        gw_url = f"http://127.0.0.1:{port}"
        try:
            wait_up(gw_url + "/health", gw)
        except RuntimeError:
            print((tmp / "gateway.log").read_text()[-3000:], file=sys.stderr)
            raise

        load_before = os.getloadavg()
        started = datetime.now(UTC)
        result = asyncio.run(drive(args, gw_url + "/v1/chat/completions", keys, gw.pid))
        load_after = os.getloadavg()
        time.sleep(5.0)  # the recorder's last batch
        recorded = None
        if db_url.startswith("sqlite"):
            with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
                recorded = db.execute("select count(*) from interactions").fetchone()[0]
        result |= {
            "started_utc": started.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "sessions": args.sessions,
            "keys": len(keys),
            "duration_s": args.duration,
            "token_delay_ms": args.token_delay_ms,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
            "recorded": recorded,
            "gateway_alive": gw.poll() is None,
        }
        rss = [r for _, r in result["rss_mib"]]
        print(
            f"{result['started_utc']} UTC, {result['machine']}, load before "
            f"{result['loadavg_before']} after {result['loadavg_after']}\n"
            f"{args.sessions} streaming sessions x {args.duration:.0f} s: {result['ok']} calls "
            f"ok ({result['calls_per_s']}/s), errors {result['errors'] or 0}, "
            f"recorded {recorded}\n"
            f"TTFT ms {result['ttft_ms']}\ntotal ms {result['total_ms']}\n"
            f"gateway RSS MiB: start {rss[0]}, max {max(rss)}, end {rss[-1]}\n"
            f"RSS series (s, MiB): {result['rss_mib']}"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    finally:
        ps.close()


if __name__ == "__main__":
    main()
