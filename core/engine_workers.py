"""Which workers behind an sglang-router rlgate may reach: only those the operator named.

A router lists its workers (``GET /workers``), and rlgate loads adapters into each one,
sending the engine key and an adapter path. The listing is the router's word, not the
operator's: a worker registered there by someone else (the router's own API takes
registrations) would receive the key. So a listed worker is reached only when it matches
the operator's ``RLGATE_ENGINE_ROUTER_WORKERS`` (URLs, or ``fnmatch`` patterns such as
``http://10.0.0.*:30000``); any other gets no key and no path, and is logged.
"""

from __future__ import annotations

import fnmatch
import logging


def worker_allowed(url: str, allowed: list[str]) -> bool:
    url = url.rstrip("/")
    return any(fnmatch.fnmatchcase(url, pattern.rstrip("/")) for pattern in allowed)


def allowed_workers(listed: list[str], allowed: list[str], log: logging.Logger) -> list[str]:
    """The listed workers on the operator's list, in order; logs each one that is not."""
    keep = [u for u in listed if worker_allowed(u, allowed)]
    for url in listed:
        if url not in keep:
            log.warning(
                "router worker %s is not in RLGATE_ENGINE_ROUTER_WORKERS (%s): it gets no "
                "engine key and no adapter",
                url,
                ", ".join(allowed) or "empty",
            )
    return keep
