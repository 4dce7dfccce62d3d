"""Query-string parameters of the dashboard pages and the JSON API: paging and filters,
and the paged lists both show (``LISTS``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from core.errors import APIError
from gateway.admin import queries
from gateway.admin.ops import db
from gateway.admin.paging import Filters, Page

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


def filters_of(request: Request, filters: Filters) -> dict[str, Any]:
    """The values of a list's declared filters in the query string (empty text: unset)."""
    out: dict[str, Any] = {name: q(request, name) for name in (*filters.equal, *filters.text)}
    if filters.created is not None:
        out |= {"since": time_param(request, "since"), "until": time_param(request, "until")}
    for arg, name in filters.flags.items():
        out[arg] = request.query_params.get(name) in _YES
    return out


@dataclass(frozen=True)
class Listing:
    """A paged dashboard list: its query and the filters it declares."""

    query: Callable[..., Page]
    filters: Filters


# the lists the pages (/admin/<name>) and the JSON API (/admin/api/<name>) both show
LISTS = {
    "sessions": Listing(queries.sessions, queries.SESSION_FILTERS),
    "feedback": Listing(queries.feedback, queries.FEEDBACK_FILTERS),
    "runs": Listing(queries.runs, queries.RUN_FILTERS),
    "keys": Listing(queries.keys, queries.KEY_FILTERS),
}


async def list_page(request: Request, name: str, scope: list[str] | None) -> Page:
    """One page of the list ``name``, filtered and paged by the query string."""
    listing = LISTS[name]
    values = filters_of(request, listing.filters)
    return await db(request, listing.query, scope, values, **paging(request))
