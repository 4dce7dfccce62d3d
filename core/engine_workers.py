"""Which workers behind an sglang-router rlgate may reach: only those the operator named.

A router lists its workers (``GET /workers``), and rlgate loads adapters into each one,
sending the engine key and an adapter path. The listing is the router's word, not the
operator's: a worker registered there by someone else (the router's own API takes
registrations) would receive the key. So a listed worker is reached only when it matches
the operator's ``RLGATE_ENGINE_ROUTER_WORKERS``; any other gets no key and no path, and is
logged.

An entry is a URL ``scheme://host:port``, parsed, never matched as a string: the scheme and
the port must be equal (the port may be ``*``, any port), and the host is compared label by
label, where a label may be a glob (``10.0.0.*`` matches ``10.0.0.5``, never
``10.0.0.5.attacker``). A listed URL with userinfo (``user@``), a path, a query or a
fragment is never a worker rlgate reaches, whatever the list says.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST = re.compile(r"^[A-Za-z0-9.\-]+$|^\[[0-9A-Fa-f:.]+\]$")
_HOST_PATTERN = re.compile(r"^[A-Za-z0-9.\-*?]+$|^\[[0-9A-Fa-f:.]+\]$")


@dataclass(frozen=True)
class WorkerAddress:
    scheme: str
    host: str  # lower case; a pattern's labels may hold globs
    port: str  # digits, or "*" in a pattern


def _parse(url: str, *, pattern: bool) -> WorkerAddress | None:
    """``scheme://host[:port][/]`` split in three; None for anything else."""
    text = url.strip()
    if text.endswith("/"):
        text = text[:-1]
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        return None
    # nothing beyond host and port: no userinfo, path, query or fragment
    # (in a pattern, ``?`` is a glob within the host, checked with the host below)
    if any(c in rest for c in ("@/#\\" if pattern else "@/?#\\")) or not rest:
        return None
    if rest.startswith("["):  # an IPv6 literal
        host, close, tail = rest[1:].partition("]")
        if not close:
            return None
        host = f"[{host}]"
        if tail and not tail.startswith(":"):
            return None
        port = tail[1:] if tail else ""
    else:
        host, colon, port = rest.partition(":")
        if colon and not port:
            return None
    if not host or not (_HOST_PATTERN if pattern else _HOST).match(host):
        return None
    if port == "":
        port = str(_DEFAULT_PORTS[scheme])
    elif not (port.isdigit() and 0 < int(port) < 65536) and not (pattern and port == "*"):
        return None
    if not pattern:
        # the standard parser must read the same host and port (no trick it reads otherwise)
        parts = urlsplit(f"{scheme}://{rest}")
        if (parts.hostname or "") != host.strip("[]").lower() or parts.username:
            return None
    return WorkerAddress(scheme, host.lower(), str(int(port)) if port.isdigit() else port)


def check_pattern(pattern: str) -> None:
    """Raises ValueError naming an entry of RLGATE_ENGINE_ROUTER_WORKERS that is not
    ``scheme://host[:port]``."""
    if _parse(pattern, pattern=True) is None:
        raise ValueError(
            f"RLGATE_ENGINE_ROUTER_WORKERS entry {pattern!r} is not scheme://host[:port] "
            "(http or https; a glob only within the host's labels, e.g. "
            "http://10.0.0.*:30000, or the port *; no user@, path, query or fragment)"
        )


def _host_matches(host: str, pattern: str) -> bool:
    if host.startswith("[") or pattern.startswith("["):
        return host == pattern
    labels, wanted = host.split("."), pattern.split(".")
    return len(labels) == len(wanted) and all(
        fnmatch.fnmatchcase(label, want) for label, want in zip(labels, wanted, strict=True)
    )


def worker_allowed(url: str, allowed: list[str]) -> bool:
    address = _parse(url, pattern=False)
    if address is None:
        return False
    for entry in allowed:
        want = _parse(entry, pattern=True)
        if (
            want is not None
            and want.scheme == address.scheme
            and want.port in ("*", address.port)
            and _host_matches(address.host, want.host)
        ):
            return True
    return False


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
