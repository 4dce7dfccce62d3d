"""Per-key rate limits: token buckets (requests/s, feedback posts/s, dashboard logins per
client IP) and a bound on concurrent model calls per key.

Two backends with the same behaviour: :class:`MemoryLimiter` (in-process; the embedded
default, one gateway process) and :class:`RedisLimiter` (shared by every replica; used
when ``RLGATE_RATELIMIT_URL`` or a ``redis://`` broker URL is set). Redis keeps a bucket
as a hash and the running calls as a sorted set, both updated by one Lua script each
(atomic, the server's clock). If Redis cannot be reached, requests are let through and a
warning is logged: a rate limiter must not turn a Redis outage into a gateway outage.

:class:`RateLimitMiddleware` applies the limits of the presented key (a hash of the
secret names the bucket, so no database lookup is needed; the bootstrap admin key is
exempt; it is the key authentication reads, gateway.edge.credentials, and a request with
more than one credential is a 400 here) and answers **429 with Retry-After** in the
caller's error format (OpenAI ``rate_limit_error``, Anthropic
``{"type": "error", "error": {"type": "rate_limit_error"}}``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import time
from collections import OrderedDict
from typing import Any, Protocol

from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from core.errors import APIError
from gateway.edge.credentials import request_credential
from gateway.edge.errors import send_error

log = logging.getLogger("rlgate.ratelimit")

FEEDBACK_PATHS = frozenset({"/feedback", "/v1/feedback", "/rl/set_reward", "/v1/rl/set_reward"})


class Limiter(Protocol):
    async def take(self, bucket: str, rate: float, burst: float, peek: bool = False) -> float:
        """Take one token; 0.0 if allowed, else the seconds until one is available.
        ``peek``: only say so, take nothing."""
        ...

    async def acquire(self, bucket: str, limit: int, ttl_s: float) -> str | None:
        """Hold one of ``limit`` slots (a token to release), or None when all are held."""
        ...

    async def release(self, bucket: str, token: str) -> None: ...


class MemoryLimiter:
    """Token buckets and slot counts in this process (the embedded default)."""

    def __init__(self, max_buckets: int = 100_000) -> None:
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._slots: dict[str, set[str]] = {}

    async def take(self, bucket: str, rate: float, burst: float, peek: bool = False) -> float:
        now = time.monotonic()
        tokens, at = self._buckets.pop(bucket, (burst, now))
        tokens = min(burst, tokens + (now - at) * rate)
        wait = 0.0
        if tokens < 1:
            wait = (1 - tokens) / rate
        elif not peek:
            tokens -= 1
        self._buckets[bucket] = (tokens, now)
        while len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)  # the least recently used bucket
        return wait

    async def acquire(self, bucket: str, limit: int, ttl_s: float) -> str | None:
        held = self._slots.setdefault(bucket, set())
        if len(held) >= limit:
            return None
        token = secrets.token_hex(8)
        held.add(token)
        return token

    async def release(self, bucket: str, token: str) -> None:
        held = self._slots.get(bucket)
        if held is not None:
            held.discard(token)
            if not held:
                self._slots.pop(bucket, None)


_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(v[1])
local ts = tonumber(v[2])
if tokens == nil or ts == nil then tokens = burst; ts = now end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens < 1 then wait = (1 - tokens) / rate elseif ARGV[3] ~= 'peek' then tokens = tokens - 1 end
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""


class RedisLimiter:
    """The same limits shared by every replica through Redis. A slot left by a process
    that died is dropped after ``ttl_s``."""

    def __init__(self, url: str, prefix: str = "rlgate:rl:") -> None:
        import redis.asyncio as aioredis

        self.prefix = prefix
        self.client = aioredis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._take = self.client.register_script(_TAKE)
        self._acquire = self.client.register_script(_ACQUIRE)
        self._warned = 0.0

    def _down(self, e: Exception) -> None:
        if time.monotonic() - self._warned > 60:
            self._warned = time.monotonic()
            log.warning("rate limits not applied, Redis unavailable: %s", e)

    async def take(self, bucket: str, rate: float, burst: float, peek: bool = False) -> float:
        try:
            raw = await self._take(
                keys=[self.prefix + "b:" + bucket], args=[rate, burst, "peek" if peek else "take"]
            )
        except Exception as e:  # fail open: see the module docstring
            self._down(e)
            return 0.0
        return float(raw)

    async def acquire(self, bucket: str, limit: int, ttl_s: float) -> str | None:
        token = secrets.token_hex(8)
        try:
            ok = await self._acquire(
                keys=[self.prefix + "c:" + bucket], args=[limit, token, int(ttl_s * 1000)]
            )
        except Exception as e:
            self._down(e)
            return token
        return token if int(ok) else None

    async def release(self, bucket: str, token: str) -> None:
        try:
            await self.client.zrem(self.prefix + "c:" + bucket, token)
        except Exception as e:
            self._down(e)

    async def close(self) -> None:
        await self.client.aclose()


def limiter_for(app: Any) -> Limiter:
    """The app's limiter, made on first use from its settings (shared by the middleware
    and the dashboard login)."""
    state = app.state
    limiter = getattr(state, "limiter", None)
    if limiter is None:
        settings = settings_of(app)
        url = settings.ratelimit_url or (
            settings.broker_url if settings.broker_url.startswith(("redis://", "rediss://")) else ""
        )
        limiter = RedisLimiter(url) if url else MemoryLimiter()
        state.limiter = limiter
    return limiter


def model_paths(app: Any) -> frozenset[str]:
    """The path patterns of model calls: what the registered APIs name (``app.state.apis``)."""
    return frozenset().union(*(a.model_paths for a in getattr(app.state, "apis", ())))


def is_model_call(app: Any, path: str) -> bool:
    """Whether ``path`` is a model call's: one of :func:`model_paths`, where ``{name}`` in
    a pattern stands for one path segment (a model named in the path, as Gemini's
    ``/v1beta/models/{model}:generateContent``)."""
    patterns = getattr(app.state, "model_call_patterns", None)
    if patterns is None:
        patterns = app.state.model_call_patterns = tuple(
            compile_path(p)[0] for p in sorted(model_paths(app))
        )
    return any(p.match(path) for p in patterns)


def settings_of(app: Any) -> Any:
    """The app's settings: ``app.state.settings``, else the running gateway's."""
    settings = getattr(app.state, "settings", None)
    return settings if settings is not None else app.state.gw.settings


def too_many(message: str, retry_after: float) -> APIError:
    """A 429 whose Retry-After is whole seconds, at least 1."""
    seconds = max(1, math.ceil(retry_after))
    return APIError(429, message, code="rate_limit_exceeded", headers={"Retry-After": str(seconds)})


def key_bucket(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:32]


class RateLimitMiddleware:
    """Pure ASGI: per-key requests/s, feedback posts/s and concurrent model calls (a slot
    is held until the last byte of the response, so a stream holds it while it runs)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = settings_of(scope["app"])
        try:  # the key authentication will read (gateway.edge.credentials)
            secret = request_credential(scope)
        except APIError as e:
            await send_error(scope, send, e)
            return
        admin = settings.admin_key.get_secret_value() if settings.admin_key else None
        if not secret or (admin and hmac.compare_digest(secret.encode(), admin.encode())):
            await self.app(scope, receive, send)
            return
        limiter = limiter_for(scope["app"])
        bucket = key_bucket(secret)
        path, method = scope["path"], scope["method"]
        err: APIError | None = None
        wait = await limiter.take("r:" + bucket, settings.rate_limit_rps, settings.rate_limit_burst)
        if wait > 0:
            err = too_many(
                f"too many requests for this key (limit {settings.rate_limit_rps:g}/s, "
                f"burst {settings.rate_limit_burst:g}); retry after the Retry-After seconds",
                wait,
            )
        elif method == "POST" and path in FEEDBACK_PATHS:
            wait = await limiter.take(
                "f:" + bucket, settings.feedback_rate_per_s, settings.feedback_burst
            )
            if wait > 0:
                err = too_many(
                    f"too many feedback posts for this key (limit "
                    f"{settings.feedback_rate_per_s:g}/s); retry after the Retry-After seconds",
                    wait,
                )
        token: str | None = None
        if err is None and method == "POST" and is_model_call(scope["app"], path):
            ttl = settings.engine_timeout_s + 60
            token = await limiter.acquire("c:" + bucket, settings.max_concurrent_per_key, ttl)
            if token is None:
                err = too_many(
                    f"this key already has {settings.max_concurrent_per_key} model calls "
                    "running (streams included); wait for one to finish",
                    1,
                )
        if err is not None:
            await send_error(scope, send, err)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            if token is not None:
                await limiter.release("c:" + bucket, token)
