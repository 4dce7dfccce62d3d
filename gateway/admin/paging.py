"""Paging for the dashboard's read-side queries: every list is one page in SQL (LIMIT/
OFFSET plus one COUNT)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from schemas.coltypes import utcnow

PAGE_SIZE = 50
Scope = list[str] | None  # the project ids the caller may see; None: every project
Values = Mapping[str, Any]  # a list's filter values by name (``Filters``)
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


def fields(row: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """A row's attributes ``names`` as a dict (what a list item shows of it)."""
    return {name: getattr(row, name) for name in names}


def in_scope(q: Select, col: Any, projects: list[str] | None) -> Select:
    return q if projects is None else q.where(col.in_(projects))


@dataclass(frozen=True)
class Filters:
    """One dashboard list's filters, each declared once; the query string is read from
    this (gateway/admin/params.py ``filters_of``) and the query narrowed by it.

    ``equal``: a text filter's query-string name -> the column it must equal (its
    ``project`` column is also the caller's scope); ``created``: the column that the
    ``since``/``until`` window narrows (None: the list has no window); ``text``: text
    filters the query applies itself; ``flags``: yes/no filters, argument name -> its
    query-string name."""

    equal: dict[str, Any]
    created: Any = None
    text: tuple[str, ...] = ()
    flags: dict[str, str] = field(default_factory=dict)

    def narrow(self, q: Select, scope: list[str] | None, values: Mapping[str, Any]) -> Select:
        """``q`` within ``scope``, each set ``equal`` filter matching and the creation
        time in [since, until) where those are set."""
        q = in_scope(q, self.equal["project"], scope)
        for name, col in self.equal.items():
            if values.get(name):
                q = q.where(col == values[name])
        if values.get("since") is not None:
            q = q.where(self.created >= values["since"])
        if values.get("until") is not None:
            q = q.where(self.created < values["until"])
        return q


def page_of(db: Session, q: Select, page: int, size: int, order: list[Any]) -> tuple[list, int]:
    total = db.scalar(select(func.count()).select_from(q.order_by(None).subquery())) or 0
    rows = db.execute(q.order_by(*order).limit(size).offset((page - 1) * size)).all()
    return rows, int(total)


def duration(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or utcnow()) - start).total_seconds()
