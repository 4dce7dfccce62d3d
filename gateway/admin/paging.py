"""Paging for the dashboard's read-side queries: every list is one page in SQL (LIMIT/
OFFSET plus one COUNT)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from schemas.coltypes import utcnow

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_TOKENS_SHOWN = 4000


@dataclass
class Page:
    items: list[dict[str, Any]]
    total: int
    page: int
    size: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    def as_json(self) -> dict[str, Any]:
        return {
            "items": jsonable(self.items),
            "total": self.total,
            "page": self.page,
            "page_size": self.size,
            "pages": self.pages,
        }


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def in_scope(q: Select, col: Any, projects: list[str] | None) -> Select:
    return q if projects is None else q.where(col.in_(projects))


def matching(
    q: Select,
    *equal: tuple[Any, Any],
    created: Any = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Select:
    """``q`` narrowed by the dashboard's filters: each (column, value) pair whose value is
    set must match, and ``created`` must lie in [since, until) where those are set."""
    for col, value in equal:
        if value:
            q = q.where(col == value)
    if since is not None:
        q = q.where(created >= since)
    if until is not None:
        q = q.where(created < until)
    return q


def page_of(db: Session, q: Select, page: int, size: int, order: list[Any]) -> tuple[list, int]:
    total = db.scalar(select(func.count()).select_from(q.order_by(None).subquery())) or 0
    rows = db.execute(q.order_by(*order).limit(size).offset((page - 1) * size)).all()
    return rows, int(total)


def duration(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or utcnow()) - start).total_seconds()
