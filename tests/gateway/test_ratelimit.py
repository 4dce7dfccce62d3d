"""Per-key rate limits (gateway/edge/ratelimit.py) on both backends: the in-process buckets and
the real Redis on 127.0.0.1:6379 (a fresh key prefix per test). The middleware runs on a
small FastAPI app with the gateway's own error handlers and settings."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from core.settings import Settings
from gateway.app import install_error_handlers
from gateway.edge.ratelimit import MemoryLimiter, RateLimitMiddleware, RedisLimiter

pytestmark = pytest.mark.anyio

REDIS_URL = "redis://127.0.0.1:6379/0"
ADMIN = "bootstrap-" + "a" * 40


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "redis"])
async def limiter(request) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    if request.param == "memory":
        yield MemoryLimiter()
        return
    lim = RedisLimiter(REDIS_URL, prefix=f"rlgate-test:{secrets.token_hex(6)}:")
    try:
        yield lim
    finally:
        keys = [k async for k in lim.client.scan_iter(match=lim.prefix + "*")]
        if keys:
            await lim.client.delete(*keys)
        await lim.close()


async def test_bucket_allows_the_burst_then_says_how_long_to_wait(limiter):
    for _ in range(5):
        assert await limiter.take("k1", 2.0, 5) == 0.0
    wait = await limiter.take("k1", 2.0, 5)
    assert 0 < wait <= 0.5 + 1e-6  # one token at 2/s
    assert await limiter.take("k2", 2.0, 5) == 0.0  # another key has its own bucket


async def test_peek_takes_nothing(limiter):
    for _ in range(3):
        assert await limiter.take("p", 0.01, 1, peek=True) == 0.0
    assert await limiter.take("p", 0.01, 1) == 0.0
    assert await limiter.take("p", 0.01, 1, peek=True) > 0


async def test_slots_bound_concurrent_holders(limiter):
    a = await limiter.acquire("s", 2, 60)
    b = await limiter.acquire("s", 2, 60)
    assert a and b and a != b
    assert await limiter.acquire("s", 2, 60) is None
    await limiter.release("s", a)
    c = await limiter.acquire("s", 2, 60)
    assert c is not None
    assert await limiter.acquire("other", 2, 60) is not None


async def test_redis_down_lets_requests_through():
    lim = RedisLimiter("redis://127.0.0.1:1/0", prefix="rlgate-test-down:")
    try:
        assert await lim.take("k", 0.001, 1) == 0.0
        assert await lim.take("k", 0.001, 1) == 0.0
        assert await lim.acquire("c", 1, 60) is not None
    finally:
        await lim.close()


def _app(limiter: object, **limits: object) -> tuple[FastAPI, dict[str, asyncio.Event]]:
    settings = Settings(admin_key=ADMIN, **limits)
    app = FastAPI()
    app.state.settings = settings
    app.state.limiter = limiter
    install_error_handlers(app)
    app.add_middleware(RateLimitMiddleware)
    events = {"entered": asyncio.Event(), "release": asyncio.Event()}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.post("/v1/messages")
    async def messages(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            events["entered"].set()
            await events["release"].wait()
            yield b"data: done\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.post("/feedback")
    async def feedback(request: Request) -> JSONResponse:
        return JSONResponse({"object": "feedback"})

    return app, events


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_429_in_each_clients_error_format(limiter):
    app, _ = _app(limiter, rate_limit_rps=0.5, rate_limit_burst=2)
    key = {"Authorization": "Bearer rlg_agent_" + secrets.token_hex(16)}
    async with _client(app) as c:
        assert (await c.post("/v1/chat/completions", headers=key)).status_code == 200
        assert (await c.post("/v1/chat/completions", headers=key)).status_code == 200
        r = await c.post("/v1/chat/completions", headers=key)
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and "Retry-After" in err["message"]
        r = await c.post("/v1/messages", headers={**key, "anthropic-version": "2023-06-01"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        # another key, the bootstrap admin key and key-less calls are not held back
        other = {"Authorization": "Bearer rlg_agent_" + secrets.token_hex(16)}
        assert (await c.post("/v1/chat/completions", headers=other)).status_code == 200
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", headers=admin)).status_code == 200


async def test_feedback_posts_have_their_own_bucket(limiter):
    app, _ = _app(limiter, feedback_rate_per_s=0.2, feedback_burst=1)
    key = {"x-api-key": "rlg_feedback_" + secrets.token_hex(16)}
    async with _client(app) as c:
        assert (await c.post("/feedback", headers=key)).status_code == 200
        r = await c.post("/feedback", headers=key)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert (await c.post("/v1/chat/completions", headers=key)).status_code == 200


async def test_a_stream_holds_its_slot_until_it_ends(limiter):
    app, events = _app(limiter, max_concurrent_per_key=1)
    key = {"Authorization": "Bearer rlg_agent_" + secrets.token_hex(16)}
    async with _client(app) as c:
        first = asyncio.create_task(c.post("/v1/messages", headers=key))
        await asyncio.wait_for(events["entered"].wait(), 30)
        r = await c.post("/v1/chat/completions", headers=key)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "model calls running" in r.json()["error"]["message"]
        events["release"].set()
        assert (await asyncio.wait_for(first, 30)).status_code == 200
        assert (await c.post("/v1/chat/completions", headers=key)).status_code == 200
