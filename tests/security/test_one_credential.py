"""Issue 26, finding 4: one credential per request. A second ``Authorization`` header
used to pick a fresh rate-limit bucket (the limiter read the last header, authentication
the first), so a limited key got 8x200 instead of 3x200 then 429s, and the concurrency
cap let every call through. Now a request with several ``Authorization`` headers,
several ``x-api-key`` headers, or the two naming different keys is a 400 in the client's
error format, and the limiter and authentication read the same key
(gateway/edge/credentials.py).

The request-rate part runs against a live gateway on PostgreSQL with the real engine;
the concurrency part on the real middleware in process, where a stream can be held open
for as long as the test needs (no timing).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from core.settings import Settings
from gateway.app import install_error_handlers
from gateway.edge.auth import presented_secret
from gateway.edge.ratelimit import MemoryLimiter, RateLimitMiddleware
from tests.gateway.conftest import engine, model_dir, session_pg_url  # noqa: F401
from tests.security.live import Live, pg_gateway

BURST = 3


@pytest.fixture(scope="module")
def live(engine, session_pg_url, tmp_path_factory) -> Iterator[Live]:  # noqa: F811
    # BURST requests, then one more every 100 s: a 429 stays a 429 for the whole test
    with pg_gateway(
        tmp_path_factory.mktemp("one-credential"),
        session_pg_url,
        engine.url,
        rate_limit_rps="0.01",
        rate_limit_burst=str(BURST),
    ) as gw:
        yield gw


def _random_key() -> str:
    return "rlg_agent_" + secrets.token_hex(16)


def _assert_one_credential_400(r: httpx.Response, style: str = "openai") -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    if style == "anthropic":
        assert body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error", body
        assert "send one credential" in body["error"]["message"], body
    else:
        assert body["error"]["type"] == "invalid_request_error", body
        assert "send one credential" in body["error"]["message"], body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body


def test_a_second_authorization_header_gets_no_fresh_bucket(live: Live) -> None:
    key = live.key()
    url = live.url + "/v1/models"
    statuses = []
    for _ in range(8):
        r = httpx.get(
            url,
            headers=[
                ("Authorization", f"Bearer {key}"),
                ("Authorization", f"Bearer {_random_key()}"),
            ],
            timeout=30,
        )
        statuses.append(r.status_code)
        if r.status_code == 400:
            _assert_one_credential_400(r)
    assert statuses == [400] * 8, statuses
    # the order does not matter
    r = httpx.get(
        url,
        headers=[("Authorization", f"Bearer {_random_key()}"), ("Authorization", f"Bearer {key}")],
        timeout=30,
    )
    _assert_one_credential_400(r)
    # the key's own limit is whole: BURST calls, then 429
    plain = [
        httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code
        for _ in range(BURST + 2)
    ]
    assert plain == [200] * BURST + [429, 429], plain


def test_authorization_and_x_api_key_must_name_the_same_key(live: Live) -> None:
    key, other = live.key(), live.key(project="p2")
    url = live.url + "/v1/models"
    same = httpx.get(url, headers={"Authorization": f"Bearer {key}", "x-api-key": key}, timeout=30)
    assert same.status_code == 200, same.text
    for second in (other, _random_key()):
        r = httpx.get(
            url, headers={"Authorization": f"Bearer {key}", "x-api-key": second}, timeout=30
        )
        _assert_one_credential_400(r)
    r = httpx.get(url, headers=[("x-api-key", key), ("x-api-key", other)], timeout=30)
    _assert_one_credential_400(r)


def test_anthropic_callers_get_the_400_in_anthropic_shape(live: Live) -> None:
    key = live.key()
    r = httpx.post(
        live.url + "/v1/messages",
        headers=[
            ("x-api-key", key),
            ("x-api-key", _random_key()),
            ("anthropic-version", "2023-06-01"),
        ],
        json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    _assert_one_credential_400(r, "anthropic")
    r = httpx.post(
        live.url + "/v1/messages",
        headers={"Authorization": f"Bearer {key}", "x-api-key": _random_key()},
        json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    _assert_one_credential_400(r, "anthropic")


def test_the_admin_api_takes_one_credential_too(live: Live) -> None:
    admin = live.key("admin")
    ok = httpx.get(live.url + "/admin/api/keys", headers={"x-api-key": admin}, timeout=30)
    assert ok.status_code == 200, ok.text
    r = httpx.get(
        live.url + "/admin/api/keys",
        headers=[("Authorization", f"Bearer {admin}"), ("Authorization", "Bearer x")],
        timeout=30,
    )
    _assert_one_credential_400(r)


# ---- the concurrency cap, in process ------------------------------------------------


def _capped_app() -> tuple[FastAPI, dict[str, asyncio.Event]]:
    app = FastAPI()
    app.state.settings = Settings(max_concurrent_per_key=1)
    app.state.limiter = MemoryLimiter()
    install_error_handlers(app)
    app.add_middleware(RateLimitMiddleware)
    events = {"entered": asyncio.Event(), "release": asyncio.Event()}

    @app.post("/v1/messages")
    async def stream(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            events["entered"].set()
            await events["release"].wait()
            yield b"data: done\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"authenticated_as": presented_secret(request)})

    return app, events


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_second_header_does_not_bypass_the_concurrency_cap(anyio_backend: str) -> None:
    app, events = _capped_app()
    key = _random_key()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        first = asyncio.create_task(
            c.post("/v1/messages", headers={"Authorization": f"Bearer {key}"})
        )
        await asyncio.wait_for(events["entered"].wait(), 30)
        # the key's one slot is held: a call that adds a header naming another key is a
        # 400 (it used to get a slot of its own and run as the key)
        statuses = []
        for second in ("Authorization", "x-api-key"):
            value = f"Bearer {_random_key()}" if second == "Authorization" else _random_key()
            r = await c.post(
                "/v1/chat/completions",
                headers=[("Authorization", f"Bearer {key}"), (second, value)],
            )
            statuses.append(r.status_code)
        assert statuses == [400, 400], statuses
        r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 429, r.text
        events["release"].set()
        assert (await asyncio.wait_for(first, 30)).status_code == 200
        r = await c.post("/v1/chat/completions", headers={"x-api-key": key})
        assert r.status_code == 200 and r.json() == {"authenticated_as": key}
