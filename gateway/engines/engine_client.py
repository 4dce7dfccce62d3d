"""The one engine client: SGLang's native ``/generate`` protocol, over aiohttp.

Works the same against SGLang on GPUs and the embedded CPU engine. Routing is
session-affine (rendezvous hashing on the session id, so one session keeps hitting one
engine's prefix cache) with failover to the next engine when one cannot be reached, or
when it lacks the request's adapter (it restarted: it is skipped until
gateway/engines/adapter_sync.py has loaded it). Behind an sglang-router, every call goes to the
router, which routes cache-aware itself.
Each engine has a bound on in-flight requests, shared fairly between projects
(gateway/engines/engine_share.py): when every engine is full a request waits for a slot, in its
project's queue, at most ``queue_wait_s``; then the caller gets 429 with ``Retry-After``.
With an engine key (RLGATE_ENGINE_API_KEY, the engines' ``--api-key``) every request
carries ``Authorization: Bearer <key>``; an engine that still answers 401/403 is a
configuration error and the client gets 503 saying so.

aiohttp rather than httpx: per non-streaming call against bench/stub_upstream.py, httpx's
async client took 0.45-0.7 ms of client CPU, aiohttp 0.11 ms.
The session is created on first use, inside the running event loop (aiohttp requires one).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from core import engine_protocol as proto
from core.errors import APIError
from gateway.engines.engine_share import FairSlots

# An engine that cannot be reached (refused, reset before answering, closed a kept-alive
# connection, or cut the answer short): the next engine is tried. ClientOSError (the
# parent of ClientConnectorError) covers a connection reset by an engine that was
# SIGKILLed with the request on the wire (ECONNRESET): measured by
# tests/faults/test_multi_process.py, it was a 500 before.
_UNREACHABLE = (
    aiohttp.ClientOSError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
)
# Anything that goes wrong talking to an engine (aiohttp's own timeouts are ClientErrors
# and TimeoutErrors, as is a `total` timeout).
_ANY = (aiohttp.ClientError, TimeoutError)
_JSON = {"Content-Type": "application/json"}


def _timeout(seconds: float, connect: float | None = None) -> aiohttp.ClientTimeout:
    # per phase, as httpx's Timeout was: waiting for a pooled connection, connecting, and
    # each read (between bytes of a streamed answer), not the whole exchange
    return aiohttp.ClientTimeout(
        total=None, connect=seconds, sock_connect=connect or seconds, sock_read=seconds
    )


def _env_proxy(url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy HTTP(S)_PROXY/NO_PROXY name for this engine (httpx honoured them)."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Lines of a streamed body, of any length (aiohttp's own line reader stops at 128 KiB,
    and an engine chunk carries every token's logprobs so far)."""
    parts: list[bytes] = []
    async for data in content.iter_any():
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if parts:
                parts.append(data[start:end])
                line = b"".join(parts)
                parts.clear()
            else:
                line = data[start:end]
            yield line
            start = end + 1
        if start < len(data):
            parts.append(data[start:])
    if parts:
        yield b"".join(parts)


async def _first_event(resp: aiohttp.ClientResponse) -> tuple[Any, AsyncIterator[bytes]]:
    """The first chunk of a 200 event stream (or proto.DONE) and the stream's lines after
    it (the same reader: a network read that brought the first chunk may bring more, even
    the ``[DONE]``); an error event raises proto.EngineRefused."""
    lines = _lines(resp.content)
    async for line in lines:
        event = proto.stream_event(line)
        if event is not None:
            return event, lines
    return proto.DONE, lines


@dataclass
class EngineSlot:
    url: str
    share: FairSlots  # its in-flight slots, shared between projects
    # adapters this engine is known to lack (it restarted, or joined): requests for them go
    # to the next engine on the ring until gateway/engines/adapter_sync.py has loaded them
    missing: set[str] = field(default_factory=set)

    @property
    def in_flight(self) -> int:
        return self.share.in_flight


class AdapterNotLoaded(APIError):
    """No engine holds the adapter a request needs (nothing was generated)."""

    def __init__(self, adapter: str, why: str = "") -> None:
        super().__init__(
            503,
            f"the policy's adapter {adapter} is not loaded on any engine yet; the gateway is "
            f"loading it, retry shortly{f' (last load error: {why})' if why else ''}",
            headers={"Retry-After": "2"},
        )
        self.adapter = adapter


# Called when an engine answered 400 to a request naming an adapter: True if the engine
# (or, behind a router, one of its workers) lacks it (gateway/engines/adapter_sync.py).
AdapterCheck = Callable[[str, str], Awaitable[bool]]


def _engine_error(resp_status: int, message: str) -> APIError:
    if resp_status in (401, 403):  # not the client's fault: the gateway's engine key is wrong
        return APIError(
            503,
            f"the engine refused the gateway's credentials (HTTP {resp_status}); set "
            "RLGATE_ENGINE_API_KEY to the engine's --api-key",
        )
    if 400 <= resp_status < 500:
        return APIError(400, f"the engine rejected the request: {message}")
    return APIError(503, f"the engine failed (HTTP {resp_status}): {message}")


def _cut_stream(e: BaseException) -> APIError:
    """A stream the engine stopped answering after it began: the connection broke (the
    engine died, aiohttp's ClientPayloadError) or it went silent past the read timeout.
    The client's stream ends with this error in its own format (gateway/api/handler.py
    ``write_stream``) and what was generated is recorded as ``abort``."""
    if isinstance(e, TimeoutError):
        return APIError(504, "the engine did not answer in time mid-stream")
    return APIError(503, f"the engine stopped mid-stream ({e.__class__.__name__}); retry")


def _exhausted(last: Exception | None) -> APIError:
    """Every candidate was tried: the adapter was missing, or no engine answered."""
    if isinstance(last, AdapterNotLoaded):
        return last
    return APIError(503, f"no engine reachable ({last.__class__.__name__ if last else 'none'})")


class EngineClient:
    """``urls``: the engines, routed by this client; or ``router``: one sglang-router that
    routes itself (its workers are reached only to load adapters, gateway/engines/adapter_sync.py).
    """

    def __init__(
        self,
        urls: list[str],
        max_in_flight: int = 64,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        router: str | None = None,
        queue_wait_s: float = 0.0,
    ) -> None:
        self.router = router.rstrip("/") if router else None
        urls = [self.router] if self.router else urls
        if not urls:
            raise ValueError("no engine URLs configured (RLGATE_ENGINE_URLS)")
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = {**_JSON, **auth}
        self.slots = [EngineSlot(u.rstrip("/"), FairSlots(max_in_flight)) for u in urls]
        self.queue_wait_s = queue_wait_s
        self.adapter_check: AdapterCheck | None = None
        self.adapter_errors: dict[str, str] = {}  # adapter -> its last load error
        self._limit = max_in_flight * len(urls) + 16
        self._timeout = _timeout(timeout_s, connect=5.0)
        self._proxies = {s.url: _env_proxy(s.url) for s in self.slots}
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:  # first use, in the running loop
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._limit,
                    limit_per_host=0,
                    # under uvicorn's 5 s (SGLang's and the embedded engine's server), so
                    # the engine never closes a connection this side is about to reuse
                    keepalive_timeout=4.0,
                ),
                timeout=self._timeout,
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def _kw(self, url: str) -> dict[str, Any]:
        if url not in self._proxies:  # a router's worker, reached to load adapters
            self._proxies[url] = _env_proxy(url)
        proxy, auth = self._proxies[url]
        return {"proxy": proxy, "proxy_auth": auth} if proxy is not None else {}

    def slot(self, url: str) -> EngineSlot | None:
        """The routed engine at ``url`` (None for a router's worker)."""
        return next((s for s in self.slots if s.url == url), None)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.slots)

    def _order(self, affinity: str) -> list[EngineSlot]:
        def score(slot: EngineSlot) -> bytes:
            return hashlib.sha256(f"{affinity}|{slot.url}".encode()).digest()

        return sorted(self.slots, key=score, reverse=True)

    @asynccontextmanager
    async def _slot(self, slot: EngineSlot, project: str, first: bool) -> AsyncIterator[None]:
        """A slot of ``slot``'s engine held for ``project``: the first engine's waited
        for (fairly, gateway/engines/engine_share.py; 429 past ``queue_wait_s``), a failover
        engine's taken at once (it had room when the candidates were listed)."""
        if not first:
            slot.share.take(project)
        elif not await slot.share.acquire(project, self.queue_wait_s):
            waited = f" (waited {self.queue_wait_s:g} s for one)" if self.queue_wait_s else ""
            raise APIError(
                429,
                f"all engines are at their in-flight limit{waited}; retry shortly",
                headers={"Retry-After": "1"},
            )
        try:
            yield
        finally:
            slot.share.release(project)

    def _candidates(self, affinity: str, adapter: str | None) -> list[EngineSlot]:
        """The engines to try in order: the session's ring order, those with room first
        (when none has room, the first is waited for), without those known to lack the
        adapter. Behind a router, the router twice for a request naming an adapter: once
        more after a worker that lacked it has loaded it."""
        ring = self._order(affinity)
        ordered = [s for s in ring if s.share.has_room()] or ring
        if adapter and self.router:
            return ordered * 2
        ready = [s for s in ordered if adapter not in s.missing]
        if adapter and not ready:
            raise AdapterNotLoaded(adapter, self.adapter_errors.get(adapter, ""))
        return ready

    async def _lacks_adapter(self, slot: EngineSlot, status: int, adapter: Any) -> bool:
        """The engine refused (400) a request naming an adapter because it lacks it."""
        if status != 400 or not isinstance(adapter, str) or self.adapter_check is None:
            return False
        return await self.adapter_check(slot.url, adapter)

    @asynccontextmanager
    async def _exchange(
        self,
        payload: dict[str, Any],
        affinity: str,
        project: str,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[tuple[EngineSlot, Any, aiohttp.ClientResponse]]:
        """The failover loop of every ``/generate``, streamed or not: tries the candidates
        in order until one answers 200 (for a stream: with a first event that is not an
        error, since SGLang reports some refusals inside a 200 stream). Yields (engine,
        the answer's JSON or the stream's first event, the response); an engine that
        cannot be reached, or refuses because it lacks the adapter, passes the request
        to the next one. The engine's slot is held, for ``project``, while the caller
        reads. ``headers``: more request headers (a trace's ``traceparent``)."""
        body = proto.encode(payload)
        sent = {**self._headers, **headers} if headers else self._headers
        adapter = payload.get("lora_path")
        stream = bool(payload.get("stream"))
        last: Exception | None = None
        for i, slot in enumerate(self._candidates(affinity, adapter)):
            async with self._slot(slot, project, first=i == 0):
                try:
                    resp = await self.http.post(
                        slot.url + proto.GENERATE,
                        data=body,
                        headers=sent,
                        **self._kw(slot.url),
                    )
                except _UNREACHABLE as e:
                    last = e
                    continue
                except TimeoutError:
                    raise APIError(504, "the engine did not answer in time") from None
                try:
                    answer: Any = None
                    try:
                        if resp.status == 200:
                            read = resp.read() if not stream else _first_event(resp)
                            answer = await read
                            status, message = 200, ""
                        else:
                            status, message = resp.status, proto.error_message(await resp.read())
                    except proto.EngineRefused as e:  # an error event inside a 200 stream
                        status, message = e.status, e.message
                    except _UNREACHABLE as e:  # cut short before its answer was read
                        last = e
                        continue
                    except TimeoutError:
                        raise APIError(504, "the engine did not answer in time") from None
                    if status == 200:
                        yield slot, json.loads(answer) if not stream else answer, resp
                        return
                    if await self._lacks_adapter(slot, status, adapter):
                        last = AdapterNotLoaded(adapter, self.adapter_errors.get(adapter, ""))
                        continue
                    raise _engine_error(status, message)
                finally:
                    resp.release()  # back to the pool (closed if not read to its end)
        raise _exhausted(last)

    async def generate(
        self,
        payload: dict[str, Any],
        affinity: str,
        project: str = "",
        headers: dict[str, str] | None = None,
    ) -> tuple[Any, str]:
        """Non-streaming generate for ``project`` (whose share of the engine's slots it
        uses); returns (response JSON, engine url)."""
        request = self._exchange({**payload, "stream": False}, affinity, project, headers)
        async with request as (slot, answer, _):
            return answer, slot.url

    @asynccontextmanager
    async def stream(
        self,
        payload: dict[str, Any],
        affinity: str,
        project: str = "",
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[tuple[AsyncIterator[dict[str, Any]], str]]:
        """Streaming generate for ``project``: yields (iterator of engine chunks, engine
        url).

        Leaving the context early (client gone) closes the connection, and the engine
        aborts the request; an explicit /abort_request is sent as well.
        """
        payload = {**payload, "stream": True}
        exchange = self._exchange(payload, affinity, project, headers)
        async with exchange as (slot, (first, lines), resp):
            finished = first is proto.DONE

            async def chunks() -> AsyncIterator[dict[str, Any]]:
                nonlocal finished
                if finished:
                    return
                yield first
                while True:
                    try:
                        line = await anext(lines)
                    except StopAsyncIteration:  # closed without its [DONE]: cut short
                        raise _cut_stream(aiohttp.ServerDisconnectedError()) from None
                    except _ANY as e:  # the engine died or went silent mid-stream
                        raise _cut_stream(e) from None
                    try:
                        event = proto.stream_event(line)
                    except proto.EngineRefused as e:  # failed after it began
                        finished = True
                        raise _engine_error(e.status, e.message) from None
                    if event is proto.DONE:
                        break
                    if event is not None:
                        yield event  # type: ignore[misc]
                finished = True

            try:
                yield chunks(), slot.url
            finally:
                if not finished:
                    resp.close()  # the connection is closed: the engine sees it
                    if payload.get("rid"):
                        await self.abort(slot.url, payload["rid"])

    async def abort(self, url: str, rid: str) -> None:
        with contextlib.suppress(*_ANY):
            await self.call("POST", url + proto.ABORT, proto.abort_body(rid), timeout=5.0)

    async def call(
        self, method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        """(status, parsed JSON or None) of one control call (health, server info, abort,
        adapter sync); transport errors propagate (aiohttp.ClientError, TimeoutError)."""
        async with self.http.request(
            method,
            url,
            data=proto.encode(body) if body is not None else None,
            headers=self._headers,
            timeout=_timeout(timeout),
            **self._kw(url),
        ) as r:
            content = await r.read()
            try:
                return r.status, json.loads(content) if content else None
            except ValueError:
                return r.status, None

    async def health(self) -> dict[str, bool]:
        out = {}
        for slot in self.slots:
            try:
                status, _ = await self.call("GET", slot.url + proto.HEALTH, timeout=2.0)
                out[slot.url] = status == 200
            except _ANY:
                out[slot.url] = False
        return out

    async def server_info(self) -> dict[str, Any] | None:
        for slot in self.slots:
            with contextlib.suppress(*_ANY):
                status, info = await self.call("GET", slot.url + proto.SERVER_INFO, timeout=5.0)
                if status == 200 and isinstance(info, dict):
                    return info
        return None
