"""Start real rlgate processes for tests and benchmarks: the embedded engine and the gateway.

Both run as subprocesses on free ports, exactly as `rlgate engine` / `rlgate gateway`
run in production; the converted packaged model is cached in RLGATE_ENGINE_TEST_CACHE
(default /tmp/rlgate-engine-cache) so the GGUF conversion happens once per machine.
The bench/ scripts start their engines with these helpers too (they need only httpx).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL_CACHE = Path(os.environ.get("RLGATE_ENGINE_TEST_CACHE", "/tmp/rlgate-engine-cache"))


@functools.cache
def packaged_model_dir() -> Path:
    """The packaged model's HF directory in MODEL_CACHE, converted from its GGUF on first
    use on this machine (about 20 s): every test gateway's tokenizer, every engine's model."""
    from engine.model_files import PACKAGED_MODEL, resolve_model_dir

    return resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    url: str
    proc: subprocess.Popen
    log: Path
    env: dict[str, str]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


def _wait_healthy(
    url: str, proc: subprocess.Popen, log: Path, timeout: float, ok: tuple[int, ...] = (200,)
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited early:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code in ok:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become healthy:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


@contextmanager
def running(
    cmd: list[str],
    env: dict[str, str],
    log: Path,
    port: int,
    timeout: float = 180,
    ok: tuple[int, ...] = (200,),
) -> Iterator[Proc]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    url = f"http://127.0.0.1:{port}"
    fh = open(log, "ab")  # noqa: SIM115 - closed below
    # its own process group: stopped with every child it started (SGLang's scheduler and
    # detokenizer, a gateway's render pool), also when a test times out
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
    )
    p = Proc(url, proc, log, env)
    try:
        _wait_healthy(url, proc, log, timeout, ok)
        yield p
    finally:
        stop_group(proc)
        fh.close()


def stop_group(proc: subprocess.Popen[bytes], grace: float = 20) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL to what is left after ``grace`` s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived their parent
    proc.wait()


def engine_cmd(port: int, *extra: str, data_dir: Path = MODEL_CACHE) -> list[str]:
    """``python -m engine`` on ``port`` with the model cache in ``data_dir``; ``extra``
    are more of its options (e.g. ``--context-length 512``)."""
    return [
        sys.executable,
        "-m",
        "engine",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--log-level",
        "warning",
        *extra,
    ]


def gateway_cmd(port: int) -> list[str]:
    return [sys.executable, "-m", "rlgate.cli", "gateway", "--port", str(port)]


# the settings of the gateways serving in this process now (tests/gateway/fake_engine.py
# in_process_gateway): each test keeps them in its environment (tests/conftest.py)
IN_PROCESS_ENVS: list[dict[str, str]] = []


def gateway_env(data_dir: Path, db_url: str, engine_url: str, **settings: str) -> dict[str, str]:
    """The RLGATE_* variables a test gateway runs with (a process's, or an in-process
    one's: tests/gateway/fake_engine.py): ``settings`` are more of them (``admin_key=``)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return {
        "RLGATE_DATA_DIR": str(data_dir),
        "RLGATE_DATABASE_URL": db_url,
        "RLGATE_ENGINE_URLS": engine_url,
        "RLGATE_TOKENIZER_PATH": str(packaged_model_dir()),
        "RLGATE_LOG_LEVEL": "warning",
        **{f"RLGATE_{k.upper()}": v for k, v in settings.items()},
    }


@contextmanager
def gateway(data_dir: Path, db_url: str, engine_url: str, **settings: str) -> Iterator[Proc]:
    """A gateway process on a migrated database, using the shared model cache."""
    port = free_port()
    env = gateway_env(data_dir, db_url, engine_url, **settings)
    # 503 = the gateway is up but no engine answers (tests of that case need it)
    log = data_dir / f"gateway-{port}.log"
    with running(gateway_cmd(port), env, log, port, 120, ok=(200, 503)) as p:
        yield p


@dataclass
class Worker:
    proc: subprocess.Popen
    log: Path


@contextmanager
def worker(
    data_dir: Path, db_url: str, broker_url: str, timeout: float = 120, **settings: str
) -> Iterator[Worker]:
    """A real ``rlgate worker`` (Celery, with its verify pool) on ``db_url`` and the broker
    ``broker_url``, started as in production; yields once Celery says it is ready.
    ``settings`` are more RLGATE_* variables (``verify_workers="1"``)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RLGATE_DATA_DIR": str(data_dir),
        "RLGATE_DATABASE_URL": db_url,
        "RLGATE_BROKER_URL": broker_url,
        **{f"RLGATE_{k.upper()}": v for k, v in settings.items()},
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "worker.log"
    name = f"test-{os.getpid()}-{time.monotonic_ns() % 10**6}@%h"
    cmd = [sys.executable, "-m", "rlgate.cli", "worker", "-n", name]
    fh = open(log, "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + timeout
        while b" ready." not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
        yield Worker(proc, log)
    finally:
        stop_group(proc, grace=30)  # the worker, its pool and its verify pool
        fh.close()


@contextmanager
def in_process_engine(**config: object) -> Iterator[str]:
    """What ``engine_cmd`` starts, without the process: the embedded engine (its app, its
    scheduler thread, the packaged model from MODEL_CACHE) served by uvicorn in a thread of
    this process (engine/server.py ``BackgroundServer``, as ``rlgate up`` runs it); yields
    its URL. ``config`` are more EngineConfig fields (``context_length=1024``). For tests
    of what the engine answers, not of how its process starts, stops or dies."""
    from engine.model_files import PACKAGED_MODEL
    from engine.server import BackgroundServer, EngineConfig

    server = BackgroundServer(
        EngineConfig(
            model_path=PACKAGED_MODEL,
            data_dir=MODEL_CACHE,
            port=free_port(),
            log_level="warning",
            **config,  # type: ignore[arg-type]
        )
    )
    server.start(timeout=120)
    try:
        yield server.url
    finally:
        server.stop()
