"""Unknown ids do not starve the gateway, logins are rate limited, and the public
switches open /metrics and /openapi.json: one gateway on SQLite with its own settings,
served from this process (tests/gateway/fake_engine.py in_process_gateway, the settings a
gateway process reads). It needs no model engine (feedback, sessions and the dashboard login do not
call one), so its engine URL points at a closed port and /health says 503."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from gateway.routes.waits import WaitSlots
from tests.gateway.fake_engine import InProcess, in_process_gateway
from tests.gateway.helpers import run_in_fresh_loop
from tests.servers import free_port

ADMIN = "bootstrap-" + secrets.token_hex(20)
WAIT_S = 6.0
BAD_POSTS = 120


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcess, object]]:
    data_dir: Path = tmp_path_factory.mktemp("gw-unknown-ids")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    engine = make_engine(db_url)
    settings = {
        "admin_key": ADMIN,
        "unknown_id_wait_s": str(WAIT_S),
        "waits_per_key": str(BAD_POSTS + 10),
        "login_rate_per_min": "3",
        "metrics_public": "true",
        "docs_public": "true",
        "session_key_grace_s": "0",
    }
    try:
        closed = f"http://127.0.0.1:{free_port()}"
        with in_process_gateway(data_dir, db_url, closed, **settings) as p:
            yield p, session_factory(engine)
    finally:
        engine.dispose()


def _key(factory, kind: str = "agent") -> str:  # type: ignore[no-untyped-def]
    with transaction(factory) as db:
        return create_key(db, "p1", kind)[1]


def test_unknown_feedback_ids_wait_without_holding_worker_threads(gw):
    """120 posts for ids nobody recorded each wait WAIT_S on the event loop; a request
    that needs a worker thread is answered meanwhile, before any of them."""
    proc, factory = gw
    key = {"Authorization": f"Bearer {_key(factory)}"}
    done: list[str] = []

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=BAD_POSTS + 10)
        async with httpx.AsyncClient(base_url=proc.url, timeout=120, limits=limits) as c:

            async def bad(i: int) -> httpx.Response:
                body = {"interaction_id": f"chatcmpl-nope{i}", "value": 1}
                r = await c.post("/feedback", headers=key, json=body)
                done.append("bad")
                return r

            tasks = [asyncio.create_task(bad(i)) for i in range(BAD_POSTS)]
            await asyncio.sleep(1.0)  # let them reach the gateway and start waiting
            other = await c.get("/v1/sessions/sess_unrelated", headers=key)
            done.append("unrelated")
            assert other.status_code == 404 and "no session" in other.json()["error"]["message"]
            return await asyncio.gather(*tasks)

    answers = run_in_fresh_loop(run())
    assert done[0] == "unrelated", done[:5]
    assert len(done) == BAD_POSTS + 1
    for r in answers:
        assert r.status_code == 404
        assert r.json()["error"]["param"] == "interaction_id"


def test_wait_slots_bound_each_key():
    slots = WaitSlots(2)
    with slots.slot("k") as a, slots.slot("k") as b, slots.slot("k") as c:
        assert (a, b, c) == (True, True, False)
        with slots.slot("other") as d:
            assert d
    assert slots.held == {}
    with slots.slot("k") as again:
        assert again


def test_failed_logins_are_rate_limited_per_ip(gw):
    proc, _ = gw
    with httpx.Client(base_url=proc.url, follow_redirects=False, timeout=60) as c:
        pre = re.search(r'name="csrf" value="([^"]+)"', c.get("/admin/login").text).group(1)
        for _ in range(3):
            r = c.post("/admin/login", data={"key": "wrong-" + secrets.token_hex(8), "csrf": pre})
            assert r.status_code == 401
        r = c.post("/admin/login", data={"key": ADMIN, "csrf": pre})  # right key, too late
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert "too many login attempts" in r.text


def test_public_switches_open_metrics_and_docs(gw):
    proc, _ = gw
    assert httpx.get(proc.url + "/metrics", timeout=30).status_code == 200
    assert "paths" in httpx.get(proc.url + "/openapi.json", timeout=30).json()
    health = httpx.get(proc.url + "/health", timeout=30)
    assert health.status_code == 503 and set(health.json()) == {"status"}
    full = httpx.get(proc.url + "/health", headers={"Authorization": f"Bearer {ADMIN}"})
    assert "engines" in full.json()


def test_a_session_key_stops_when_its_session_ends(gw):
    """With RLGATE_SESSION_KEY_GRACE_S=0 a session key is refused once its session ended."""
    proc, factory = gw
    agent = {"Authorization": f"Bearer {_key(factory)}"}
    r = httpx.post(proc.url + "/v1/sessions", headers=agent, json={}, timeout=30)
    sid, skey = r.json()["id"], {"Authorization": f"Bearer {r.json()['api_key']}"}
    url = f"{proc.url}/v1/sessions/{sid}"
    assert httpx.get(url, headers=skey, timeout=30).status_code == 200
    assert httpx.post(url + "/end", headers=skey, timeout=30).status_code == 200
    deadline = time.monotonic() + 20  # the auth cache forgets a key within 2 s
    while (status := httpx.get(url, headers=skey, timeout=30).status_code) != 401:
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert httpx.get(url, headers=agent, timeout=30).status_code == 200
