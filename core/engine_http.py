"""The engines over HTTP, synchronously (httpx): what the trainer says to them (publish,
rollback, unload, the tick's sync, the eval gate) and where they are.

The bodies and readings are ``core/engine_protocol.py``'s; the gateway speaks the same
protocol over aiohttp (``gateway/engines/engine_client.py``). Two shapes of deployment
(docs/scaling.md):
- a list of engine URLs (``RLGATE_ENGINE_URLS``): every engine is loaded directly;
- one sglang-router (``RLGATE_ENGINE_ROUTER_URL``): adapters are loaded into each worker
  it lists that the operator named (``RLGATE_ENGINE_ROUTER_WORKERS``); a listed worker
  the operator did not name gets neither the engine key nor an adapter path, and is
  logged (``core/engine_workers.py``).
"""

from __future__ import annotations

import functools
import logging
import ssl
from typing import Any

import httpx

from core import engine_adapters
from core import engine_protocol as proto
from core.engine_workers import allowed_workers
from core.settings import Settings

log = logging.getLogger("rlgate.engines")


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS settings, built once per process: building them (loading
    certifi's CA bundle) takes ~25 ms, which each short-lived engine client would pay
    again (a publish opens one per engine for the load and one for the warm-up)."""
    return httpx.create_ssl_context()


class RouterError(Exception):
    """The router could not be asked for its workers; the message says why."""


class EngineHTTP:
    """One engine at ``url``; every call sends ``headers`` (the engine key)."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        timeout: float = 660.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            timeout=timeout, headers=headers, transport=transport, verify=_tls()
        )

    def __enter__(self) -> EngineHTTP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _json(self, r: httpx.Response) -> Any:
        try:
            return r.json() if r.content else None
        except ValueError:
            return None

    def get(self, path: str) -> Any:
        """The JSON of ``GET path``; :class:`proto.EngineRefused` unless 200."""
        r = self.client.get(self.url + path)
        if r.status_code != 200:
            raise proto.EngineRefused(r.status_code, proto.error_message(r.content))
        return self._json(r)

    def generate(self, body: dict[str, Any]) -> Any:
        """A non-streaming ``/generate``; :class:`proto.EngineRefused` unless 200."""
        r = self.client.post(self.url + proto.GENERATE, json=body)
        if r.status_code != 200:
            raise proto.EngineRefused(r.status_code, proto.error_message(r.content))
        return r.json()

    def adapters(self) -> dict[str, str]:
        return engine_adapters.loaded_adapters(self.get(proto.MODELS))

    def load(self, name: str, path: str) -> tuple[bool, str]:
        r = self.client.post(self.url + proto.LOAD, json=proto.load_body(name, path))
        return engine_adapters.load_result(r.status_code, self._json(r), name)

    def unload(self, name: str) -> tuple[bool, str]:
        r = self.client.post(self.url + proto.UNLOAD, json=proto.unload_body(name))
        return engine_adapters.unload_result(r.status_code, self._json(r), name)

    def weight_version(self) -> str | None:
        return engine_adapters.weight_version(self.get(proto.MODEL_INFO))

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON of ``POST path``; :class:`proto.EngineRefused` unless 200."""
        r = self.client.post(self.url + path, json=body)
        if r.status_code != 200:
            raise proto.EngineRefused(r.status_code, proto.error_message(r.content))
        return self._json(r)

    def release_memory(self) -> None:
        """Pause generation, then give the GPU memory up (SGLang with
        ``--enable-memory-saver``); on a refusal, generation continues and it raises."""
        self.post(proto.PAUSE, proto.pause_body())
        try:
            self.post(proto.RELEASE_MEMORY, proto.memory_body())
        except Exception:
            self.post(proto.CONTINUE, proto.continue_body())
            raise

    def resume_memory(self) -> None:
        """Take the GPU memory back, then continue generating (the waiting requests run)."""
        self.post(proto.RESUME_MEMORY, proto.memory_body())
        self.post(proto.CONTINUE, proto.continue_body())


def router_workers(router_url: str, headers: dict[str, str], timeout: float = 10.0) -> list[str]:
    """Every worker an sglang-router lists; :class:`RouterError` if it cannot say."""
    errors = []
    with httpx.Client(timeout=timeout, headers=headers, verify=_tls()) as client:
        for path in proto.WORKER_LISTINGS:
            try:
                r = client.get(router_url.rstrip("/") + path)
            except httpx.HTTPError as e:
                raise RouterError(f"router {router_url}: {type(e).__name__}: {e}") from e
            try:
                urls = (
                    engine_adapters.worker_urls(r.json())
                    if r.status_code == 200 and r.content
                    else None
                )
            except ValueError:
                urls = None
            if urls is not None:
                return urls
            errors.append(f"GET {path}: HTTP {r.status_code}")
    raise RouterError(f"router {router_url} lists no workers ({'; '.join(errors)})")


def control_urls(settings: Settings) -> list[str]:
    """Every engine to load adapters into: the router's workers that the operator named,
    or the engine list."""
    if not settings.engine_router_url:
        return settings.engine_url_list
    listed = router_workers(settings.engine_router_url, settings.engine_headers)
    return allowed_workers(listed, settings.engine_router_worker_list, log)
