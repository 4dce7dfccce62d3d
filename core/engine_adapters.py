"""What SGLang's adapter and info routes answer, read once for every caller: the adapters
an engine has loaded, a load or unload result, the weight and engine versions, a router's
worker list, and the plan that brings an engine to the serving adapters (the trainer's
publish and the gateway's adapter sync). The request bodies and the generate answers are
core/engine_protocol.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def loaded_adapters(models: Any) -> dict[str, str]:
    """The LoRA adapters an engine's ``GET /v1/models`` lists, name -> path: the entries
    with a ``parent`` (the base model has none) and the path as ``root``, as SGLang and
    the embedded engine answer."""
    data = models.get("data") if isinstance(models, dict) else None
    return {
        m["id"]: str(m.get("root") or "")
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


def unload_result(status: int, body: Any, name: str) -> tuple[bool, str]:
    """(gone?, message) of an ``/unload_lora_adapter`` answer: gone when it succeeded, or
    when the engine does not hold ``name`` (SGLang: "does not exist"; embedded: "not
    loaded"), so unloading is idempotent."""
    body = body if isinstance(body, dict) else {}
    message = str(body.get("error_message") or body.get("error") or "")
    if status == 200 and body.get("success", True):
        return True, message
    absent = "does not exist" in message or "not loaded" in message
    return absent and name not in (body.get("loaded_adapters") or {}), message


def weight_version(model_info: Any) -> str | None:
    """The weight version an engine reports in ``GET /get_model_info``."""
    value = model_info.get("weight_version") if isinstance(model_info, dict) else None
    return str(value) if value is not None else None


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


@dataclass(frozen=True)
class SyncPlan:
    """What brings one engine to the serving adapters: ``load`` (name, path) pairs it
    lacks, and ``unload``: names it holds that must not serve (retired or rejected
    versions; an adapter rlgate does not manage is left alone)."""

    load: list[tuple[str, str]]
    unload: list[str]


def sync_plan(serving: dict[str, str], loaded: dict[str, str], retired: set[str]) -> SyncPlan:
    """``serving``: name -> the path to load it from; ``loaded``: what the engine holds;
    ``retired``: names of versions out of service."""
    load = [(n, p) for n, p in sorted(serving.items()) if n not in loaded]
    unload = sorted(n for n in loaded if n in retired and n not in serving)
    return SyncPlan(load, unload)
