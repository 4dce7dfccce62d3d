"""Query-string parameters of the dashboard pages and the JSON API: paging and filters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from core.errors import APIError
from gateway.admin import queries

_YES = ("1", "true", "yes")


def int_param(request: Request, name: str, default: int, lo: int = 1, hi: int = 10**9) -> int:
    try:
        return max(lo, min(hi, int(request.query_params.get(name, default))))
    except ValueError:
        raise APIError(400, f"{name} must be an integer") from None


def time_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise APIError(400, f"{name} must be an ISO 8601 time, e.g. 2025-01-31T12:00") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def q(request: Request, name: str) -> str | None:
    """A text parameter; empty means absent."""
    return request.query_params.get(name) or None


def paging(request: Request) -> dict[str, int]:
    return {
        "page": int_param(request, "page", 1),
        "size": int_param(request, "page_size", queries.PAGE_SIZE, 1, queries.MAX_PAGE_SIZE),
    }


def session_filters(request: Request) -> dict[str, Any]:
    return {
        "project": q(request, "project"),
        "status": q(request, "status"),
        "rated": q(request, "rated"),
        "agent": q(request, "agent"),
        "since": time_param(request, "since"),
        "until": time_param(request, "until"),
    }


def feedback_filters(request: Request) -> dict[str, Any]:
    return {
        "project": q(request, "project"),
        "source": q(request, "source"),
        "target_type": q(request, "target_type"),
        "session_id": q(request, "session_id"),
        "since": time_param(request, "since"),
        "until": time_param(request, "until"),
    }


def run_filters(request: Request) -> dict[str, Any]:
    return {
        "project": q(request, "project"),
        "status": q(request, "status"),
        "trigger": q(request, "trigger"),
    }


def key_filters(request: Request) -> dict[str, Any]:
    return {
        "project": q(request, "project"),
        "kind": q(request, "kind"),
        "include_revoked": request.query_params.get("revoked") in _YES,
        "include_session_keys": request.query_params.get("session_keys") in _YES,
    }
