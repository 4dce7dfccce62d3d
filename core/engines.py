"""Where the engines are, for the calls that must reach each one (loading adapters).

Two shapes (docs/scaling.md):
- a list of engine URLs (``RLGATE_ENGINE_URLS``): the gateway routes itself (rendezvous
  hashing on the session) and every engine is loaded directly;
- one sglang-router (``RLGATE_ENGINE_ROUTER_URL``): the gateway sends every generate call
  to the router, and adapters are loaded into each worker the router lists. The router's
  ``GET /workers`` answers ``{"workers": [{"url": ...}, ...]}`` (SGLang Model Gateway);
  older routers answer ``GET /list_workers`` with ``{"urls": [...]}``; both are read.

Used by the trainer (sync, httpx) and parsed the same way by the gateway (async), which
is why it lives in core: the trainer never imports the gateway.
"""

from __future__ import annotations

from typing import Any

import httpx

from core.settings import Settings

# the router's worker listings, newest first
WORKER_LISTINGS = ("/workers", "/list_workers")


class RouterError(Exception):
    """The router could not be asked for its workers; the message says why."""


def worker_urls(body: Any) -> list[str] | None:
    """The worker URLs of a router's listing (either shape), or None if it is neither."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("workers"), list):
        urls = [w.get("url") for w in body["workers"] if isinstance(w, dict)]
    elif isinstance(body.get("urls"), list):
        urls = list(body["urls"])
    else:
        return None
    return [u.rstrip("/") for u in urls if isinstance(u, str) and u]


def adapter_names(models: Any) -> set[str]:
    """The LoRA adapters an engine's ``GET /v1/models`` lists: the entries with a
    ``parent`` (the base model has none), as SGLang and the embedded engine answer."""
    data = models.get("data") if isinstance(models, dict) else None
    return {
        m["id"]
        for m in data or []
        if isinstance(m, dict) and m.get("parent") and isinstance(m.get("id"), str)
    }


def load_result(status: int, body: Any, name: str) -> tuple[bool, str]:
    """(loaded?, the engine's message) of a ``/load_lora_adapter`` answer: loaded when it
    succeeded, or when the engine already holds ``name`` (a retried or concurrent load)."""
    body = body if isinstance(body, dict) else {}
    message = str(body.get("error_message") or body.get("error") or "")
    if status == 200 and body.get("success", True):
        return True, message
    return name in (body.get("loaded_adapters") or {}) or "already loaded" in message, message


def router_workers(router_url: str, headers: dict[str, str], timeout: float = 10.0) -> list[str]:
    """The workers behind an sglang-router; :class:`RouterError` if it cannot say."""
    errors = []
    with httpx.Client(timeout=timeout, headers=headers) as client:
        for path in WORKER_LISTINGS:
            try:
                r = client.get(router_url.rstrip("/") + path)
            except httpx.HTTPError as e:
                raise RouterError(f"router {router_url}: {type(e).__name__}: {e}") from e
            urls = worker_urls(r.json()) if r.status_code == 200 and r.content else None
            if urls is not None:
                return urls
            errors.append(f"GET {path}: HTTP {r.status_code}")
    raise RouterError(f"router {router_url} lists no workers ({'; '.join(errors)})")


def control_urls(settings: Settings) -> list[str]:
    """Every engine to load adapters into: the router's workers, or the engine list."""
    if settings.engine_router_url:
        return router_workers(settings.engine_router_url, settings.engine_headers)
    return settings.engine_url_list
