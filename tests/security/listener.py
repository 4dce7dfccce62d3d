"""A loopback HTTP endpoint for the security tests: it records every request it gets and
answers with a fixed status and JSON body. It plays an attacker's listener, a router and
its workers, or a judge that never answers (``hold=True``: each call waits for
``release`` and is counted while in flight)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    auth: str | None
    body: Any  # the parsed JSON body, or None


Answer = Callable[["Seen"], tuple[int, Any]]  # a request -> (status, JSON body or None)


class Listener(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: Answer | None = None, hold: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer: Answer = answer or (lambda _seen: (200, {}))
        self.hold = hold
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.in_flight = self.most = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> Listener:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()

    def __enter__(self) -> Listener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    server: Listener

    def log_message(self, *args: Any) -> None:
        return None

    def _serve(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        seen = Seen(self.command, self.path, self.headers.get("Authorization"), body)
        s = self.server
        with s.lock:
            s.seen.append(seen)
            s.in_flight += 1
            s.most = max(s.most, s.in_flight)
        try:
            if s.hold:
                s.release.wait(120)
            status, answer = s.answer(seen)
        finally:
            with s.lock:
                s.in_flight -= 1
        data = b"" if answer is None else json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _serve  # noqa: N815
