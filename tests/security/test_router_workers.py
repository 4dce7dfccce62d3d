"""Issue 26, finding 7: the engine key and adapter paths go only to engines the operator
named. A worker that an sglang-router lists but that is not on the operator's list
(RLGATE_ENGINE_ROUTER_WORKERS: scheme://host[:port], parsed) gets neither, from the trainer's
publish or from a gateway's adapter sync, and both log it.

The router and the two workers are small HTTP servers on loopback that record what they
receive; one worker is the operator's, the other one is not (an attacker's listener that
registered itself with the router).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from core.settings import Settings
from tests.security.listener import Answer, Listener, Seen

KEY = "engine-key-of-the-operator"


def _router_or_engine(workers: list[str] | None) -> Answer:
    """A router (GET /workers lists ``workers``) or, without a list, an engine."""

    def answer(seen: Seen) -> tuple[int, Any]:
        if seen.method == "GET":
            if workers is not None and seen.path == "/workers":
                return 200, {"workers": [{"url": u} for u in workers]}
            return 200, {"object": "list", "data": []}
        return 200, {"success": True, "error_message": "", "loaded_adapters": {}}

    return answer


@pytest.fixture
def servers() -> Iterator[tuple[Listener, Listener, Listener]]:
    """(router, the operator's worker, a worker the operator did not name)."""
    ours, theirs = Listener(_router_or_engine(None)), Listener(_router_or_engine(None))
    router = Listener(_router_or_engine([ours.url, theirs.url]))
    with ours, theirs, router:
        yield router, ours, theirs


def _settings(router: Listener, allowed: str) -> Settings:
    return Settings(
        engine_router_url=router.url,
        engine_router_workers=allowed,
        engine_api_key=KEY,
        engine_urls="http://unused:1",
    )


@pytest.mark.parametrize(
    "allowed", ["{ours}", "http://127.0.0.*:{port}", "HTTP://127.0.0.1:{port}/"]
)
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
    publish.warm(urls, "p-policy-v1", settings.engine_headers)
    assert [(x.method, x.path, x.auth) for x in ours.seen] == [
        ("POST", "/load_lora_adapter", f"Bearer {KEY}"),
        ("POST", "/generate", f"Bearer {KEY}"),  # the warm-up through the new adapter
    ]
    assert theirs.seen == []  # no key, no adapter path, no warm-up


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
    from gateway.engines.adapter_sync import AdapterSync
    from gateway.engines.engine_client import EngineClient
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
        (x.method, x.path, x.auth) for x in ours.seen
    ]
    assert theirs.seen == []
    assert theirs.url in caplog.text


# Issue 36, finding 6: the entries are parsed, not globbed over the whole URL string.
ATTACKS = [
    "http://10.0.0.1@attacker:30000",  # userinfo: the host is attacker
    "http://10.0.0.5.attacker:30000",  # a host that only starts like the pattern
    "http://127.0.0.1:1234/evilworker?:30000",  # a path and a query that end in the port
    "http://10.0.0.5:30000/x",
    "http://10.0.0.5:30000#:30000",
    "http://10.0.0.5:300001",
    "https://10.0.0.5:30000",
    "http://10.0.0.5",
]


@pytest.mark.parametrize("url", ATTACKS)
def test_pattern_matches_scheme_host_and_port_apart(url: str) -> None:
    from core.engine_workers import worker_allowed

    allowed = ["http://10.0.0.*:30000", "http://127.0.0.*:30000"]
    assert not worker_allowed(url, allowed)
    assert worker_allowed("http://10.0.0.5:30000", allowed)
    assert worker_allowed("http://10.0.0.5:30000/", allowed)
    assert worker_allowed("HTTP://10.0.0.5:30000", allowed)
    assert worker_allowed("http://10.0.0.5:1234", ["http://10.0.0.5:*"])
    assert worker_allowed("http://w1:80", ["http://w?"])  # the scheme's default port


def test_even_an_exact_entry_refuses_userinfo_path_and_query() -> None:
    from core.engine_workers import worker_allowed

    for url in (ATTACKS[0], ATTACKS[2], ATTACKS[3], ATTACKS[4]):
        assert not worker_allowed(url, [url]), url


def test_attack_url_listed_by_the_router_gets_no_key() -> None:
    """A fake router lists the attacker's listener as ``<listener>/evilworker?:<port>``,
    where ``<port>`` is the operator's worker's: the listener receives nothing."""
    from trainer import publish

    ours, theirs = Listener(_router_or_engine(None)), Listener(_router_or_engine(None))
    with ours, theirs:
        port = ours.server_address[1]
        evil = f"{theirs.url}/evilworker?:{port}"
        with Listener(_router_or_engine([ours.url, evil])) as router:
            settings = _settings(router, f"http://127.0.0.*:{port}")
            urls = publish.engines(settings)
            assert urls == [ours.url]
            publish.load_everywhere(urls, "p-v1", "/adapters/p/p-v1", settings.engine_headers)
    assert theirs.seen == []


@pytest.mark.parametrize(
    "entry",
    ["http://10.0.0.1@x:1", "http://10.0.0.*:30000/path", "10.0.0.1:30000", "http://h:port"],
)
def test_a_bad_entry_is_refused_at_start(entry: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="is not scheme://host"):
        Settings(engine_router_url="http://r:1", engine_router_workers=entry)
