"""Issue 26, finding 7: the engine key and adapter paths go only to engines the operator
named. A worker that an sglang-router lists but that is not on the operator's list
(RLGATE_ENGINE_ROUTER_WORKERS: URLs or fnmatch patterns) gets neither, from the trainer's
publish or from a gateway's adapter sync, and both log it.

The router and the two workers are small HTTP servers on loopback that record what they
receive; one worker is the operator's, the other one is not (an attacker's listener that
registered itself with the router).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from core.settings import Settings

KEY = "engine-key-of-the-operator"


class Recorder(ThreadingHTTPServer):
    """Answers as a router (GET /workers) or an engine, and records every request."""

    def __init__(self, workers: list[str] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.workers = workers
        self.seen: list[tuple[str, str, str | None, Any]] = []  # method, path, auth, body

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, *args: Any) -> None:
        return None

    def _answer(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: Any) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization"), body))

    def do_GET(self) -> None:
        self._record(None)
        if self.server.workers is not None and self.path == "/workers":
            return self._answer({"workers": [{"url": u} for u in self.server.workers]})
        return self._answer({"object": "list", "data": []})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self._record(body)
        self._answer({"success": True, "error_message": "", "loaded_adapters": {}})


@pytest.fixture
def servers() -> Iterator[tuple[Recorder, Recorder, Recorder]]:
    """(router, the operator's worker, a worker the operator did not name)."""
    ours, theirs = Recorder(), Recorder()
    router = Recorder([ours.url, theirs.url])
    threads = [
        threading.Thread(target=s.serve_forever, daemon=True) for s in (router, ours, theirs)
    ]
    for t in threads:
        t.start()
    yield router, ours, theirs
    for s in (router, ours, theirs):
        s.shutdown()
        s.server_close()


def _settings(router: Recorder, allowed: str) -> Settings:
    return Settings(
        engine_router_url=router.url,
        engine_router_workers=allowed,
        engine_api_key=KEY,
        engine_urls="http://unused:1",
    )


@pytest.mark.parametrize("allowed", ["{ours}", "http://127.0.0.1:{port}*"])
def test_publish_reaches_only_the_named_workers(servers, allowed, caplog) -> None:  # type: ignore[no-untyped-def]
    from trainer import publish

    router, ours, theirs = servers
    allowed = allowed.format(ours=ours.url, port=ours.server_address[1])
    settings = _settings(router, allowed)
    with caplog.at_level(logging.WARNING):
        urls = publish.engines(settings)
    assert urls == [ours.url]
    assert theirs.url in caplog.text and "RLGATE_ENGINE_ROUTER_WORKERS" in caplog.text
    publish.load_everywhere(
        urls, "p-policy-v1", "/adapters/p/live/p-policy-v1", settings.engine_headers
    )
    assert [(m, p, a) for m, p, a, _ in ours.seen] == [
        ("POST", "/load_lora_adapter", f"Bearer {KEY}")
    ]
    assert theirs.seen == []  # no key, no adapter path


def test_no_list_means_no_router_worker(servers, caplog) -> None:  # type: ignore[no-untyped-def]
    import pytest
    from pydantic import ValidationError

    from trainer import publish

    router, ours, theirs = servers
    # a router without the operator's list is refused when the settings load, in one line
    with pytest.raises(ValidationError, match="needs RLGATE_ENGINE_ROUTER_WORKERS"):
        _settings(router, "")
    # a list that names neither worker reaches neither, and says so
    with caplog.at_level(logging.WARNING):
        assert publish.engines(_settings(router, "http://10.9.9.9:1")) == []
    assert ours.url in caplog.text and theirs.url in caplog.text
    assert ours.seen == [] and theirs.seen == []


def test_gateway_sync_reaches_only_the_named_workers(servers, sqlite_url, caplog) -> None:  # type: ignore[no-untyped-def]
    from core.db import transaction
    from gateway.adapter_sync import AdapterSync
    from gateway.engine_client import EngineClient
    from schemas.tables import PolicyVersionRow
    from tests.faults.helpers import setup_db

    router, ours, theirs = servers
    factory, _ = setup_db(sqlite_url, project="p")
    with transaction(factory) as db:
        db.add(
            PolicyVersionRow(
                id="pv-1",
                project_id="p",
                name="p-policy-v1",
                version=1,
                base_model="packaged",
                path="/adapters/p/p-policy-v1",
                lora_config={},
                status="serving",
            )
        )

    async def round_() -> tuple[list[str], list[str], bool]:
        client = EngineClient([], api_key=KEY, router=router.url)
        sync = AdapterSync(client, factory, router_workers=[ours.url])
        try:
            loaded = await sync.sync_once()
            lacks = await sync.check(router.url, "p-policy-v1")
            return loaded, await sync.workers(), lacks
        finally:
            await client.close()

    with caplog.at_level(logging.WARNING, logger="rlgate.gateway"):
        loaded, workers, _ = asyncio.run(round_())
    assert workers == [ours.url]
    assert loaded == [f"{ours.url}:p-policy-v1"]
    assert ("POST", "/load_lora_adapter", f"Bearer {KEY}") in [
        (m, p, a) for m, p, a, _ in ours.seen
    ]
    assert theirs.seen == []
    assert theirs.url in caplog.text
