"""Real SGLang for the tests: the real-SGLang tier (docs/engine.md, "Real SGLang on CPU").

``sglang_python()`` is the SGLang venv's Python: ``RLGATE_TEST_SGLANG_PYTHON`` (a GPU
install, say), else the CPU venv that scripts/sglang_cpu_venv builds and caches outside
the clone (built on first use, 5-15 minutes; reused afterwards). ``sglang_server()``
starts ``python -m sglang.launch_server`` on the packaged model's converted HF directory
with LoRA enabled and ``--api-key``, on a free port, and stops it afterwards.

On CPU it runs the recipe of issue 27 (one OpenMP thread: with two on shared cores
OpenMP spins and throughput collapses); ``RLGATE_TEST_SGLANG_DEVICE=gpu`` drops the CPU
flags (scripts/device_check.sh). There is no skip: a tier that cannot start SGLang fails.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlgate.sglang_memory import with_fraction
from tests.servers import REPO, free_port, packaged_model_dir, running

MAX_LORA_RANK = 16
# what rlgate needs of any SGLang (docs/engine.md): LoRA on every projection, the key
LORA_ARGS = (
    "--enable-lora",
    "--max-lora-rank",
    str(MAX_LORA_RANK),
    "--lora-target-modules",
    "all",
    "--max-loras-per-batch",
    "2",
)
# SGLang 0.5.23 on a CPU without CUDA (with tests/sglang_cpu/rlgate_sglang_cpu.py)
CPU_ARGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--dtype",
    "float32",
    "--max-total-tokens",
    "8192",
    "--context-length",
    "2048",
    "--cuda-graph-backend-decode",
    "disabled",
    "--cuda-graph-backend-prefill",
    "disabled",
    "--disable-overlap-schedule",
    "--grammar-backend",
    "xgrammar",
    "--skip-server-warmup",
    "--sleep-on-idle",
    "--lora-backend",
    "torch_native",
)
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
# 35-45 s on an idle machine, much more on busy shared cores; under the tests' own 600 s
# limit (pyproject.toml), which counts the fixture's start in the first test using it
START_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class SGLang:
    """A running SGLang server: its URL, key, the release it reports, its log."""

    url: str
    api_key: str
    version: str
    log: Path
    pid: int = 0  # the launcher's process id (its scheduler and detokenizer run under it)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def sglang_python() -> str:
    """The Python of an SGLang install; builds the cached CPU venv when none is named."""
    named = os.environ.get("RLGATE_TEST_SGLANG_PYTHON")
    if named:
        return named
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "sglang_cpu_venv")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"scripts/sglang_cpu_venv failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    return done.stdout.strip().splitlines()[-1]


def model_dir() -> Path:
    """The packaged model's HF directory (RLGATE_TEST_SGLANG_MODEL: another one, as the
    GPU check's random-weight model)."""
    named = os.environ.get("RLGATE_TEST_SGLANG_MODEL")
    return Path(named) if named else packaged_model_dir()


@contextmanager
def sglang_server(log: Path, *extra: str) -> Iterator[SGLang]:
    """SGLang on the packaged model with LoRA and a fresh ``--api-key``."""
    python = sglang_python()
    gpu = os.environ.get("RLGATE_TEST_SGLANG_DEVICE") == "gpu"
    port = free_port()
    key = secrets.token_urlsafe(16)
    cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model_dir())]
    # one argument: a key may start with "-" (token_urlsafe), which argparse reads as an option
    cmd += ["--host", "127.0.0.1", "--port", str(port), f"--api-key={key}"]
    # on CPU, --mem-fraction-static from the memory free now, as `rlgate up` computes it
    device_args, memory = with_fraction(model_dir(), [*(() if gpu else CPU_ARGS), *extra])
    cmd += [*LORA_ARGS, *device_args]
    if memory is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            fh.write(f"[rlgate test tier] {memory.reason()}\n")
    # SGLang's own environment: none of rlgate's packages on its path
    env = {"PYTHONPATH": "", **({} if gpu else CPU_ENV)}
    with running(cmd, env, log, port, START_TIMEOUT_S) as proc:
        info = httpx.get(
            f"{proc.url}/get_server_info", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ).json()
        yield SGLang(proc.url, key, str(info.get("version")), log, proc.proc.pid)
