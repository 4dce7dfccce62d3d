"""The one engine client: SGLang's native ``/generate`` protocol, over httpx.

Works the same against SGLang on GPUs and the embedded CPU engine. Routing is
session-affine (rendezvous hashing on the session id, so one session keeps hitting one
engine's prefix cache) with failover to the next engine when one cannot be reached.
Each engine has a bound on in-flight requests; when every engine is full the caller gets
429 with ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.errors import APIError


@dataclass
class EngineSlot:
    url: str
    limit: int
    in_flight: int = 0


def _engine_error(resp_status: int, body: bytes) -> APIError:
    try:
        data = json.loads(body)
        message = (
            data.get("error", {}).get("message") if isinstance(data.get("error"), dict) else None
        )
        message = message or data.get("message") or data.get("error") or data.get("detail")
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")[:500]
    if 400 <= resp_status < 500:
        return APIError(400, f"the engine rejected the request: {message}")
    return APIError(503, f"the engine failed (HTTP {resp_status}): {message}")


class EngineClient:
    def __init__(self, urls: list[str], max_in_flight: int = 64, timeout_s: float = 600.0) -> None:
        if not urls:
            raise ValueError("no engine URLs configured (RLGATE_ENGINE_URLS)")
        self.slots = [EngineSlot(u.rstrip("/"), max_in_flight) for u in urls]
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(
                max_connections=max_in_flight * len(urls) + 16, max_keepalive_connections=64
            ),
        )

    async def close(self) -> None:
        await self.http.aclose()

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.slots)

    def _order(self, affinity: str) -> list[EngineSlot]:
        def score(slot: EngineSlot) -> bytes:
            return hashlib.sha256(f"{affinity}|{slot.url}".encode()).digest()

        return sorted(self.slots, key=score, reverse=True)

    @asynccontextmanager
    async def _slot(self, slot: EngineSlot) -> AsyncIterator[None]:
        slot.in_flight += 1
        try:
            yield
        finally:
            slot.in_flight -= 1

    def _candidates(self, affinity: str) -> list[EngineSlot]:
        ordered = [s for s in self._order(affinity) if s.in_flight < s.limit]
        if not ordered:
            raise APIError(
                429,
                "all engines are at their in-flight limit; retry shortly",
                headers={"Retry-After": "1"},
            )
        return ordered

    async def generate(self, payload: dict[str, Any], affinity: str) -> tuple[Any, str]:
        """Non-streaming generate; returns (response JSON, engine url)."""
        last: Exception | None = None
        for slot in self._candidates(affinity):
            async with self._slot(slot):
                try:
                    resp = await self.http.post(f"{slot.url}/generate", json=payload)
                except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
                    last = e
                    continue
                except httpx.TimeoutException:
                    raise APIError(504, "the engine did not answer in time") from None
                if resp.status_code != 200:
                    raise _engine_error(resp.status_code, resp.content)
                return resp.json(), slot.url
        raise APIError(503, f"no engine reachable ({last.__class__.__name__ if last else 'none'})")

    @asynccontextmanager
    async def stream(
        self, payload: dict[str, Any], affinity: str
    ) -> AsyncIterator[tuple[AsyncIterator[dict[str, Any]], str]]:
        """Streaming generate: yields (iterator of engine chunks, engine url).

        Leaving the context early (client gone) closes the connection, and the engine
        aborts the request; an explicit /abort_request is sent as well.
        """
        payload = {**payload, "stream": True}
        last: Exception | None = None
        for slot in self._candidates(affinity):
            async with self._slot(slot):
                try:
                    ctx = self.http.stream("POST", f"{slot.url}/generate", json=payload)
                    resp = await ctx.__aenter__()
                except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
                    last = e
                    continue
                except httpx.TimeoutException:
                    raise APIError(504, "the engine did not answer in time") from None
                finished = False
                try:
                    if resp.status_code != 200:
                        raise _engine_error(resp.status_code, await resp.aread())

                    async def chunks(
                        resp: httpx.Response = resp,
                    ) -> AsyncIterator[dict[str, Any]]:
                        nonlocal finished
                        async for line in resp.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                finished = True
                                return
                            yield json.loads(data)
                        finished = True

                    yield chunks(), slot.url
                finally:
                    await ctx.__aexit__(None, None, None)
                    if not finished and payload.get("rid"):
                        await self.abort(slot.url, payload["rid"])
                return
        raise APIError(503, f"no engine reachable ({last.__class__.__name__ if last else 'none'})")

    async def abort(self, url: str, rid: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.http.post(f"{url}/abort_request", json={"rid": rid}, timeout=5.0)

    async def health(self) -> dict[str, bool]:
        out = {}
        for slot in self.slots:
            try:
                r = await self.http.get(f"{slot.url}/health", timeout=2.0)
                out[slot.url] = r.status_code == 200
            except httpx.HTTPError:
                out[slot.url] = False
        return out

    async def server_info(self) -> dict[str, Any] | None:
        for slot in self.slots:
            try:
                r = await self.http.get(f"{slot.url}/get_server_info", timeout=5.0)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                continue
        return None
