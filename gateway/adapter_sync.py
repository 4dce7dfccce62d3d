"""Every engine holds every serving adapter before it serves requests for it.

An engine that restarted, or joined, starts without adapters. Each gateway brings it to
the serving versions itself instead of waiting for the trainer's tick:
- every ``RLGATE_ENGINE_SYNC_S`` seconds, ``sync_once`` lists each engine's adapters
  (``GET /v1/models``) and loads the serving ones it lacks (``POST /load_lora_adapter``,
  the path the trainer recorded; engines must read it at that path: RLGATE_ADAPTER_DIR);
- between two rounds, an engine that answers 400 to a request naming an adapter is asked
  whether it lacks it (``check``). If it does, the engine client marks it and tries the
  next engine on the session's ring, and a round starts at once. Behind an sglang-router
  (which picks the worker itself), the adapter is loaded into every worker that lacks it
  before the client sends the request through the router once more.

So a request is never served by the base model in place of its adapter: the engine
refuses an adapter it lacks, and the request goes where it is loaded, or gets a 503 that
says so (gateway/engine_client.py ``AdapterNotLoaded``). Its recorded ``policy_version``
is the adapter named in the call that sampled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.engines import WORKER_LISTINGS, adapter_names, load_result, worker_urls
from gateway.engine_client import EngineClient
from schemas.atdp import PolicyStatus
from schemas.tables import PolicyVersionRow

log = logging.getLogger("rlgate.gateway")
_ANY = (aiohttp.ClientError, TimeoutError)
LOAD_TIMEOUT_S = 120.0


class AdapterSync:
    def __init__(
        self, engines: EngineClient, factory: sessionmaker[Session], interval_s: float = 5.0
    ) -> None:
        self.engines = engines
        self.factory = factory
        self.interval_s = interval_s
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one round at a time
        engines.adapter_check = self.check

    # ---- what is, and what should be ----------------------------------------------

    def _serving_rows(self) -> dict[str, str]:
        with self.factory() as db:
            rows = db.execute(
                select(PolicyVersionRow.name, PolicyVersionRow.path).where(
                    PolicyVersionRow.status == PolicyStatus.serving
                )
            ).all()
        return {name: path for name, path in rows}

    async def serving(self) -> dict[str, str]:
        """Every project's serving adapter: name -> path."""
        return await asyncio.to_thread(self._serving_rows)

    async def workers(self) -> list[str]:
        """The engines to load adapters into: the router's workers, or the engine list."""
        router = self.engines.router
        if not router:
            return [s.url for s in self.engines.slots]
        for path in WORKER_LISTINGS:
            with contextlib.suppress(*_ANY):
                status, body = await self.engines.call("GET", router + path)
                urls = worker_urls(body) if status == 200 else None
                if urls is not None:
                    return urls
        log.warning("router %s did not list its workers (GET %s)", router, WORKER_LISTINGS)
        return []

    async def adapters(self, url: str) -> set[str] | None:
        """The adapters the engine at ``url`` holds; None if it cannot be asked."""
        try:
            status, body = await self.engines.call("GET", f"{url}/v1/models")
        except _ANY:
            return None
        return adapter_names(body) if status == 200 else None

    async def load(self, url: str, name: str, path: str) -> bool:
        body = {"lora_name": name, "lora_path": path}
        try:
            status, answer = await self.engines.call(
                "POST", f"{url}/load_lora_adapter", body, timeout=LOAD_TIMEOUT_S
            )
        except _ANY as e:
            self.engines.adapter_errors[name] = f"{url}: {type(e).__name__}: {e}"
            return False
        ok, message = load_result(status, answer, name)
        if ok:
            log.info("loaded serving adapter %s into %s", name, url)
            self.engines.adapter_errors.pop(name, None)
            return True
        self.engines.adapter_errors[name] = f"{url}: HTTP {status}: {message[:300]}"
        log.warning("could not load %s into %s: %s", name, url, message[:300])
        return False

    # ---- bringing engines to the serving versions -----------------------------------

    async def sync_once(self) -> list[str]:
        """Load the serving adapters every engine lacks; returns 'url:name' loaded."""
        async with self._lock:
            serving = await self.serving()
            loaded = []
            for url in await self.workers():
                have = await self.adapters(url)
                if have is None:  # down: the client fails over; the next round retries
                    continue
                lacking = set(serving) - have
                for name in sorted(lacking):
                    if await self.load(url, name, serving[name]):
                        lacking.discard(name)
                        loaded.append(f"{url}:{name}")
                if slot := self.engines.slot(url):
                    slot.missing = lacking
            return loaded

    async def check(self, url: str, adapter: str) -> bool:
        """An engine (``url``: it, or the router) refused a request naming ``adapter``:
        True if it lacks it. The engine is marked and a round starts; behind a router,
        the adapter is loaded into the workers that lack it before this returns."""
        if not self.engines.router:
            have = await self.adapters(url)
            if have is None or adapter in have:
                return False  # refused for another reason: the client's error stands
            if slot := self.engines.slot(url):
                slot.missing.add(adapter)
            log.warning("engine %s lacks adapter %s: next engine, and loading it", url, adapter)
            self._wake.set()
            return True
        lacking = []
        for worker in await self.workers():
            have = await self.adapters(worker)
            if have is not None and adapter not in have:
                lacking.append(worker)
        if not lacking:
            return False
        path = (await self.serving()).get(adapter)
        if path is None:  # no longer serving: the pipeline retries on the new version
            return True
        log.warning("workers %s lack adapter %s: loading it", lacking, adapter)
        for worker in lacking:
            await self.load(worker, adapter, path)
        return True

    async def run(self) -> None:
        """Rounds every ``interval_s``, or at once when ``check`` found an engine lacking."""
        while True:
            try:
                loaded = await self.sync_once()
                if loaded:
                    log.info("adapter sync loaded %s", loaded)
            except Exception:  # the database or an engine is down: the next round retries
                log.warning("adapter sync round failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
