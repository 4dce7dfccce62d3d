"""Driving a stack of processes started by `rlgate up`'s code (rlgate/up.py ``launch``):
ports, readiness, kills, and client load alternating between its gateways."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import httpx

from rlgate.up import Child
from tests.servers import free_port


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the restarted engine at {url} did not come up")


def consecutive_free(n: int) -> int:
    """A port p with p .. p+n-1 all free (launch() uses consecutive ports)."""
    for _ in range(200):
        base = free_port()
        if base + n < 65000 and all(port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def worker_ready(child: Child, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while b"ready." not in child.log.read_bytes():
        assert child.proc.poll() is None, child.log.read_text()[-3000:]
        assert time.monotonic() < deadline, child.log.read_text()[-3000:]
        time.sleep(0.3)


def sigkill(child: Child) -> None:
    """SIGKILL of the child's process group (a worker's schedule too), reaped."""
    os.killpg(child.proc.pid, signal.SIGKILL)
    child.proc.wait(timeout=30)


def chat(c: httpx.Client, url: str, key: str, body: dict[str, Any], sid: str | None = None):
    headers = {"Authorization": f"Bearer {key}"}
    if sid:
        headers["X-Session-Id"] = sid
    return c.post(url + "/v1/chat/completions", json=body, headers=headers)


class Load:
    """``clients`` threads of one-turn calls (fresh sessions) alternating between
    gateways; every call's start, end, status and interaction id."""

    def __init__(self, gateways: list[str], key: str, clients: int) -> None:
        self.gateways, self.key = gateways, key
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, i: int) -> None:
        k = 0
        with httpx.Client(timeout=120) as c:
            while not self.halt.is_set():
                k += 1
                gw = self.gateways[(i + k) % 2]
                text = f"Client {i}, call {k}: name a color."
                body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
                start = time.monotonic()
                try:
                    r = chat(c, gw, self.key, body)
                    status, iid = r.status_code, r.json().get("id")
                except (httpx.HTTPError, ValueError) as e:
                    status, iid = type(e).__name__, None
                with self.lock:
                    self.calls.append(
                        {"start": start, "end": time.monotonic(), "status": status, "id": iid}
                    )

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(timeout=150)

    def acked(self) -> int:
        with self.lock:
            return sum(x["status"] == 200 for x in self.calls)

    def done_after(self, t: float) -> int:
        with self.lock:
            return sum(x["start"] > t for x in self.calls)

    def wait(self, cond: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, self.calls[-5:]
            time.sleep(0.1)
