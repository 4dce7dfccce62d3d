"""What the stub-upstream benches share (gateway_overhead.py, load_streams.py): their
processes (the stub upstream, gateways, a proxy) started in one scratch folder with a log
each, waited for, and stopped together."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``url`` answers (below 500); an error if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not start")


class Procs:
    """Processes run from one scratch folder (``tmp``), each logging to a file there;
    ``close`` stops them all and removes the folder."""

    def __init__(self, prefix: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}

    def spawn(
        self, cmd: list[str], log: str, extra: dict[str, str] | None = None
    ) -> subprocess.Popen:
        out = open(self.tmp / log, "wb")  # noqa: SIM115 - lives as long as the process
        p = subprocess.Popen(
            cmd,
            env={**self.env, **(extra or {})},
            cwd=self.tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(p)
        return p

    def stub(self, port: int, *args: str) -> str:
        """bench/stub_upstream.py on ``port``, up; its URL."""
        cmd = [sys.executable, str(REPO / "bench" / "stub_upstream.py"), "--port", str(port)]
        url = f"http://127.0.0.1:{port}"
        wait_up(url + "/health", self.spawn([*cmd, *args], "stub.log"))
        return url

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
