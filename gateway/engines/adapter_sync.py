"""Every engine holds every serving adapter before it serves requests for it.

An engine that restarted, or joined, starts without adapters. Each gateway brings it to
the serving versions itself instead of waiting for the trainer's tick:
- every ``RLGATE_ENGINE_SYNC_S`` seconds, ``sync_once`` lists each engine's adapters
  (``GET /v1/models``), loads the serving ones it lacks (``POST /load_lora_adapter``,
  from the version's live directory, which the trainer created: core/live_adapters.py;
  engines must read it at that path: RLGATE_ADAPTER_DIR) and unloads retired or
  rejected versions it still holds (core/engine_protocol.py ``sync_plan``, the trainer's
  tick uses the same plan), except one that a request of this gateway still uses
  (gateway/engines/adapter_leases.py): it goes in a later round, or with the background unload
  of the switch that retired it (gateway/engines/unloads.py);
- between two rounds, an engine that answers 400 to a request naming an adapter is asked
  whether it lacks it (``check``). If it does, the engine client marks it and tries the
  next engine on the session's ring, and a round starts at once. Behind an sglang-router
  (which picks the worker itself), the adapter is loaded into every worker that lacks it
  before the client sends the request through the router once more. Only the workers
  the operator named (``RLGATE_ENGINE_ROUTER_WORKERS``) are reached; any other worker
  the router lists gets no key and no adapter, and is logged (core/engine_workers.py).

So a request is never served by the base model in place of its adapter: the engine
refuses an adapter it lacks, and the request goes where it is loaded, or gets a 503 that
says so (gateway/engines/engine_client.py ``AdapterNotLoaded``). Its recorded ``policy_version``
is the adapter named in the call that sampled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from sqlalchemy.orm import Session, sessionmaker

from core import engine_adapters
from core import engine_protocol as proto
from core.engine_workers import allowed_workers
from core.live_adapters import live_path
from core.serving_version import adapters_in_service
from gateway.engines.adapter_leases import Leases
from gateway.engines.engine_client import EngineClient

log = logging.getLogger("rlgate.gateway")
_ANY = (aiohttp.ClientError, TimeoutError)
LOAD_TIMEOUT_S = 120.0


class AdapterSync:
    def __init__(
        self,
        engines: EngineClient,
        factory: sessionmaker[Session],
        interval_s: float = 5.0,
        router_workers: list[str] | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.engines = engines
        self.leases = leases or Leases()  # this gateway's requests in flight per adapter
        self.router_workers = router_workers or []  # the operator's list (patterns)
        self.factory = factory
        self.interval_s = interval_s
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one round at a time
        engines.adapter_check = self.check

    # ---- what is, and what should be ----------------------------------------------

    def _rows(self) -> tuple[dict[str, str], set[str]]:
        with self.factory() as db:
            serving, out = adapters_in_service(db)
        return {name: str(live_path(path)) for name, path in serving.items()}, out

    async def versions(self) -> tuple[dict[str, str], set[str]]:
        """(every project's serving adapter: name -> the path to load it from, the names
        of versions out of service)."""
        return await asyncio.to_thread(self._rows)

    async def serving(self) -> dict[str, str]:
        return (await self.versions())[0]

    async def workers(self) -> list[str]:
        """The engines to load adapters into: the router's workers, or the engine list."""
        router = self.engines.router
        if not router:
            return [s.url for s in self.engines.slots]
        for path in proto.WORKER_LISTINGS:
            with contextlib.suppress(*_ANY):
                status, body = await self.engines.call("GET", router + path)
                urls = engine_adapters.worker_urls(body) if status == 200 else None
                if urls is not None:
                    return allowed_workers(urls, self.router_workers, log)
        log.warning("router %s did not list its workers (GET %s)", router, proto.WORKER_LISTINGS)
        return []

    async def adapters(self, url: str) -> dict[str, str] | None:
        """The adapters the engine at ``url`` holds (name -> path); None if it cannot be
        asked."""
        try:
            status, body = await self.engines.call("GET", url + proto.MODELS)
        except _ANY:
            return None
        return engine_adapters.loaded_adapters(body) if status == 200 else None

    async def load(self, url: str, name: str, path: str) -> bool:
        try:
            status, answer = await self.engines.call(
                "POST", url + proto.LOAD, proto.load_body(name, path), timeout=LOAD_TIMEOUT_S
            )
        except _ANY as e:
            self.engines.adapter_errors[name] = f"{url}: {type(e).__name__}: {e}"
            return False
        ok, message = engine_adapters.load_result(status, answer, name)
        if ok:
            log.info("loaded serving adapter %s into %s", name, url)
            self.engines.adapter_errors.pop(name, None)
            return True
        self.engines.adapter_errors[name] = f"{url}: HTTP {status}: {message[:300]}"
        log.warning("could not load %s into %s: %s", name, url, message[:300])
        return False

    async def unload(self, url: str, name: str) -> bool:
        try:
            status, answer = await self.engines.call(
                "POST", url + proto.UNLOAD, proto.unload_body(name), timeout=LOAD_TIMEOUT_S
            )
        except _ANY:
            return False
        ok, message = engine_adapters.unload_result(status, answer, name)
        if ok:
            log.info("unloaded retired adapter %s from %s", name, url)
        else:
            log.warning("could not unload retired %s from %s: %s", name, url, message[:300])
        return ok

    async def unload_everywhere(self, name: str) -> list[str]:
        """Unload ``name`` from every engine (one that does not hold it counts as done);
        returns the engines where it failed (a later round retries them)."""
        failed = []
        for url in await self.workers():
            if not await self.unload(url, name):
                failed.append(url)
        return failed

    # ---- bringing engines to the serving versions -----------------------------------

    async def sync_once(self) -> list[str]:
        """Load the serving adapters every engine lacks and unload the retired ones it
        holds; returns 'url:name' loaded and '-url:name' unloaded."""
        async with self._lock:
            serving, out = await self.versions()
            done = []
            for url in await self.workers():
                have = await self.adapters(url)
                if have is None:  # down: the client fails over; the next round retries
                    continue
                plan = engine_adapters.sync_plan(serving, have, out)
                lacking = {name for name, _ in plan.load}
                for name, path in plan.load:
                    if await self.load(url, name, path):
                        lacking.discard(name)
                        done.append(f"{url}:{name}")
                for name in plan.unload:
                    if self.leases.count(name):  # in use here: unloaded once it is not
                        continue
                    if await self.unload(url, name):
                        done.append(f"-{url}:{name}")
                if slot := self.engines.slot(url):
                    slot.missing = lacking
            return done

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
