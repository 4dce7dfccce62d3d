"""The demo's HTTP clients: every call it makes (training traffic, the held-out
evaluation, feedback, admin reads) goes through :class:`RetryTransport`, which honours
the gateway's backpressure: a 429 or 503 is retried after its ``Retry-After`` (seconds or
an HTTP date; without one, a doubling backoff), and a connection the server dropped is
retried too, up to ``ATTEMPTS`` tries with at most ``MAX_DELAY_S`` between two. After
the last try the response (or the error) goes to the caller as it came.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from typing import Any

import httpx

RETRY_STATUSES = frozenset({429, 503})
ATTEMPTS = 12
MAX_DELAY_S = 30.0
FIRST_DELAY_S = 0.5
TIMEOUT_S = 300.0

_sleep = asyncio.sleep  # the one place the demo waits to retry (tests replace it)


def retry_after(value: str | None, fallback: float) -> float:
    """Seconds to wait before the next try: ``Retry-After`` as delta-seconds or an HTTP
    date, else ``fallback``; at most ``MAX_DELAY_S``."""
    if value:
        try:
            return min(max(0.0, float(value)), MAX_DELAY_S)
        except ValueError:
            pass
        try:
            at = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            return min(fallback, MAX_DELAY_S)
        return min(max(0.0, at - time.time()), MAX_DELAY_S)
    return min(fallback, MAX_DELAY_S)


class RetryTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` transport that retries backpressure answers and dropped connections
    (not timeouts: a request that timed out may have been served)."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport | None = None, attempts: int = ATTEMPTS
    ) -> None:
        self.inner = inner or httpx.AsyncHTTPTransport()
        self.attempts = attempts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        delay = FIRST_DELAY_S
        for attempt in range(1, self.attempts + 1):
            last = attempt == self.attempts
            try:
                response = await self.inner.handle_async_request(request)
            except httpx.TimeoutException:
                raise
            except httpx.TransportError:
                if last:
                    raise
                await _sleep(delay)
                delay = min(2 * delay, MAX_DELAY_S)
                continue
            if last or response.status_code not in RETRY_STATUSES:
                return response
            wait = retry_after(response.headers.get("retry-after"), delay)
            await response.aclose()
            await _sleep(wait)
            delay = min(2 * delay, MAX_DELAY_S)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.inner.aclose()


def http_client(base_url: str, api_key: str) -> httpx.AsyncClient:
    """An ``httpx`` client on the gateway with a key, retrying as above."""
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=TIMEOUT_S,
        headers={"Authorization": f"Bearer {api_key}"},
        transport=RetryTransport(),
    )


def openai_client(base_url: str, api_key: str) -> Any:
    """An ``AsyncOpenAI`` client on the gateway's ``/v1``: its own retries are off, the
    transport's are the demo's one retry policy."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=f"{base_url.rstrip('/')}/v1",
        api_key=api_key,
        max_retries=0,
        timeout=TIMEOUT_S,
        http_client=httpx.AsyncClient(timeout=TIMEOUT_S, transport=RetryTransport()),
    )
