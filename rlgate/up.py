"""`rlgate up`: the embedded default in one command.

Migrates the SQLite database, starts the embedded engine with the packaged model, the
gateway and a Celery worker with its schedule on the
embedded broker; prints the base URL, the keys (kept in ``<data dir>/up-keys.json`` and
reused while valid, rlgate/up_keys.py), when training runs and copy-paste snippets
(rlgate/up_snippets.py), and writes Codex and OpenClaw configurations under
``<data dir>/clients/`` (rlgate/up_clients.py). A port already taken is refused before
anything starts. Ctrl-C stops everything. Each process logs to ``<data dir>/logs/``.

``--engines N --gateways M --workers W`` start N engines on consecutive ports from the
engine port, M gateways on consecutive ports from the gateway port and W workers (the
first one runs the schedule); every gateway and worker is given every engine URL. More
than one gateway or worker needs a database and a broker several processes can share
(PostgreSQL, Redis or RabbitMQ): SQLite and the embedded broker are single-process.

The engine is protected even on loopback: each start generates a random engine key
(unless RLGATE_ENGINE_API_KEY is set) and hands it to the engine (``--api-key``), the
gateway and the worker through their environment, and the engine loads adapters only
from RLGATE_ADAPTER_DIR (``--allowed-lora-dir``; default ``<data dir>/adapters``), where
the trainer writes them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
import httpx

from core.settings import ConfigError, Settings
from rlgate.up_sglang import sglang_command


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path


def _start(
    name: str, args: list[str], logs: Path, env: dict[str, str], command: list[str] | None = None
) -> Child:
    """Start ``python args`` (or ``command`` as it is) as a child with its own log."""
    log = logs / f"{name}.log"
    fh = open(log, "ab")  # noqa: SIM115 - owned by the child's lifetime
    proc = subprocess.Popen(
        command or [sys.executable, *args],
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    return Child(name, proc, log)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _wait_healthy(child: Child, url: str, timeout: float, ok: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + timeout
    shown = ""
    while True:
        if child.proc.poll() is not None:
            raise click.ClickException(
                f"{child.name} exited (code {child.proc.returncode}); last lines of "
                f"{child.log}:\n{_tail(child.log)}"
            )
        try:
            if httpx.get(url + "/health", timeout=2).status_code in ok:
                return
        except httpx.HTTPError:
            pass
        last = _tail(child.log, 1)
        if last and last != shown and "[rlgate" in last:
            click.echo(f"  {last.strip()}", err=True)
            shown = last
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"{child.name} did not become healthy in {timeout:.0f} s; see {child.log}"
            )
        time.sleep(0.5)


class _Steps:
    """``[k/n] what ...`` when a start step begins, and how long it took when it ends."""

    def __init__(self, total: int) -> None:
        self.total, self.k, self.t0 = total, 0, time.monotonic()

    def begin(self, what: str) -> None:
        self.k += 1
        self.t0 = time.monotonic()
        click.echo(f"[{self.k}/{self.total}] {what} ...", err=True)

    def end(self, state: str) -> None:
        click.echo(f"      {state} ({time.monotonic() - self.t0:.0f} s)", err=True)


def _signal_group(child: Child, sig: int) -> None:
    """Signal the child's whole process group (a Celery worker has pool processes)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, sig)


def _stop(children: list[Child]) -> None:
    for child in reversed(children):
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for child in reversed(children):
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(max(0.1, deadline - time.monotonic()))
        _signal_group(child, signal.SIGKILL)  # whatever of the group is still there


PACKAGED_MAX_TOKENS = 512  # output cap for requests naming none, with the packaged model


@dataclass
class Stack:
    """Engines, gateways and (optionally) trainer workers as child processes."""

    children: list[Child]
    bases: list[str]
    engine_urls: list[str]
    logs: Path
    trainer_note: str

    @property
    def base(self) -> str:
        return self.bases[0]

    @property
    def engine_url(self) -> str:
        return self.engine_urls[0]

    def check_alive(self) -> None:
        for child in self.children:
            if child.proc.poll() is not None:
                raise click.ClickException(
                    f"{child.name} stopped (code {child.proc.returncode}); last lines of "
                    f"{child.log}:\n{_tail(child.log)}"
                )

    def stop(self) -> None:
        _stop(self.children)


def split_cores(cores: int, trainer: bool, engines: int = 1) -> tuple[int, int]:
    """(threads per engine, trainer threads). The engines generate while the trainer
    trains, so each gets its own share of the cores: two PyTorch thread pools on the same
    cores spin against each other and both slow to a crawl (measured: the trainer at a
    fifth of its speed next to a busy 2-thread engine on 2 cores). Without a trainer the
    engines take every core. Several engines split their share (at least one thread
    each). Several workers each get the trainer share: a project trains on one worker at
    a time. An OMP_NUM_THREADS already set wins for the trainer."""
    share = cores if not trainer or cores < 2 else cores // 2
    per_engine = max(1, share // max(1, engines))
    if not trainer or cores < 2:
        return per_engine, cores
    return per_engine, int(os.environ.get("OMP_NUM_THREADS") or cores - share)


@dataclass(frozen=True)
class Shape:
    """How many of each process `rlgate up` starts."""

    engines: int = 1
    gateways: int = 1
    workers: int = 1


SHARED_ERROR = (
    "several gateways or workers need a database and broker that several processes can "
    "share: set RLGATE_DATABASE_URL to PostgreSQL and RLGATE_BROKER_URL to Redis or "
    "RabbitMQ (SQLite and the embedded broker are single-process)"
)


def check_shape(settings: Settings, port: int, engine_port: int, n: Shape) -> None:
    """Refuse, in one line, a shape that cannot work."""
    if min(n.engines, n.gateways, n.workers) < 1:
        raise click.ClickException("--engines, --gateways and --workers must be at least 1")
    if n.gateways > 1 or n.workers > 1:
        db = settings.effective_database_url
        broker = settings.effective_broker_url
        if db.startswith("sqlite") or broker.startswith(("sqla+", "memory")):
            raise click.ClickException(SHARED_ERROR)
    gw = set(range(port, port + n.gateways))
    if gw & set(range(engine_port, engine_port + n.engines)):
        raise click.ClickException(
            f"gateway ports {port}-{port + n.gateways - 1} overlap engine ports "
            f"{engine_port}-{engine_port + n.engines - 1}; choose --port or --engine-port"
        )


def _port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (as uvicorn does, with
    SO_REUSEADDR: a port that only has connections in TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(settings: Settings, port: int, engine_port: int, n: Shape) -> None:
    """Refuse, in one line (exit 2), a gateway or engine port that is already taken."""
    wanted = [("--port", "gateway", settings.gateway_host, port + i) for i in range(n.gateways)]
    wanted += [("--engine-port", "engine", "127.0.0.1", engine_port + i) for i in range(n.engines)]
    for flag, what, host, p in wanted:
        if not _port_free(host, p):
            raise ConfigError(
                f"port {p} ({what}, {host}) is already in use; stop what listens there or "
                f"choose another with {flag}"
            )


def _name(kind: str, i: int, n: int) -> str:
    return kind if n == 1 else f"{kind}{i + 1}"


def _default_cap(settings: Settings) -> dict[str, str]:
    """With the packaged model, requests that name no output limit (Codex's) stop at
    PACKAGED_MAX_TOKENS instead of filling the context; a set RLGATE_DEFAULT_MAX_TOKENS wins."""
    if settings.default_max_tokens is not None or not settings.uses_packaged_model:
        return {}
    return {"RLGATE_DEFAULT_MAX_TOKENS": str(PACKAGED_MAX_TOKENS)}


def launch(
    settings: Settings,
    port: int,
    engine_port: int,
    trainer: bool,
    extra_env: dict[str, str] | None = None,
    engine_args: tuple[str, ...] = (),
    shape: Shape | None = None,
) -> Stack:
    """Start the embedded stack on a migrated database; stops what started on failure."""
    shape = shape or Shape()
    check_shape(settings, port, engine_port, shape)
    check_ports(settings, port, engine_port, shape)
    data_dir = settings.data_dir.resolve()
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    engine_ports = [engine_port + i for i in range(shape.engines)]
    engine_urls = [f"http://127.0.0.1:{p}" for p in engine_ports]
    ports = [port + i for i in range(shape.gateways)]
    bases = [f"http://{settings.gateway_host}:{p}" for p in ports]
    env = {
        **os.environ,
        "RLGATE_DATA_DIR": str(data_dir),
        "RLGATE_ENGINE_URLS": ",".join(engine_urls),
        "RLGATE_GATEWAY_PORT": str(port),
        "RLGATE_ENGINE_PORT": str(engine_port),
        # the engine's --api-key, read by the engine, the gateway and the worker alike
        "RLGATE_ENGINE_API_KEY": settings.engine_api_key_value or secrets.token_urlsafe(32),
        **_default_cap(settings),
        **(extra_env or {}),
    }
    engine_threads, trainer_threads = split_cores(os.cpu_count() or 1, trainer, shape.engines)
    sglang = settings.engine == "sglang"
    if "--num-threads" not in engine_args and not sglang:
        engine_args = (*engine_args, "--num-threads", str(engine_threads))
    if "--allowed-lora-dir" not in engine_args and not sglang:
        adapters = str(settings.effective_adapter_dir.resolve())
        engine_args = (*engine_args, "--allowed-lora-dir", adapters)
    children: list[Child] = []
    step = _Steps(3 if trainer else 2)
    try:
        step.begin(
            f"engine: {shape.engines} {'SGLang' if sglang else 'embedded'} (the first start "
            "converts the packaged model: 1-2 minutes)"
        )
        for i, (p, url) in enumerate(zip(engine_ports, engine_urls, strict=True)):
            args = ["-m", "engine", "--port", str(p), *engine_args]
            command = sglang_command(settings, p, env["RLGATE_ENGINE_API_KEY"]) if sglang else None
            name = _name("engine", i, shape.engines)
            children.append(_start(name, args, logs, env, command))
            _wait_healthy(children[-1], url, 900)  # one at a time: the first converts
        step.end("answering")
        step.begin(f"gateway: {shape.gateways} on {', '.join(bases)}")
        started = []
        for i, p in enumerate(ports):
            args = ["-m", "rlgate.cli", "gateway", "--port", str(p)]
            gw_env = {**env, "RLGATE_GATEWAY_PORT": str(p)}
            children.append(_start(_name("gateway", i, shape.gateways), args, logs, gw_env))
            started.append(children[-1])
        for child, base in zip(started, bases, strict=True):
            _wait_healthy(child, base, 120, ok=(200, 503))
        step.end("answering")
        trainer_note = "trainer: not started (--no-trainer)"
        if trainer:
            step.begin(f"trainer: {shape.workers} Celery worker(s)")
            worker_env = {**env, "OMP_NUM_THREADS": str(trainer_threads)}
            names = []
            for i in range(shape.workers):
                name = _name("worker", i, shape.workers)
                beat = ["--beat"] if i == 0 else []  # one schedule for all workers
                node = ["--hostname", f"{name}@%h"] if shape.workers > 1 else []
                args = ["-m", "rlgate.cli", "worker", *beat, *node]
                children.append(_start(name, args, logs, worker_env))
                names.append(str(logs / f"{name}.log"))
            trainer_note = (
                f"trainer: {shape.workers} Celery worker(s), the first with the schedule "
                f"(log {', '.join(names)})"
                if shape.workers > 1
                else f"trainer: Celery worker + schedule (log {names[0]})"
            )
            step.end("started (it takes jobs once Celery is up, a few seconds)")
    except BaseException:
        _stop(children)
        raise
    return Stack(children, bases, engine_urls, logs, trainer_note)
