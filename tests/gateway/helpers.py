"""Small helpers for gateway tests: read what was recorded."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from schemas.convert import to_record
from schemas.tables import InteractionRow, SessionRow


def interactions(stack, **where) -> list:  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        q = select(InteractionRow)
        for k, v in where.items():
            q = q.where(getattr(InteractionRow, k) == v)
        return [to_record(r) for r in db.scalars(q.order_by(InteractionRow.seq)).all()]


def wait_recorded(stack, ids: list[str], timeout: float = 20.0) -> list:  # type: ignore[no-untyped-def]
    """The records with these ids, once the gateway's writer has committed them."""
    deadline = time.monotonic() + timeout
    while True:
        with stack.factory() as db:
            rows = db.scalars(select(InteractionRow).where(InteractionRow.id.in_(ids))).all()
            if len(rows) == len(ids):
                by_id = {r.id: to_record(r) for r in rows}
                return [by_id[i] for i in ids]
        if time.monotonic() > deadline:
            raise AssertionError(f"not recorded within {timeout}s: {ids}")
        time.sleep(0.05)


def counts(stack) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        return (
            db.scalar(select(func.count()).select_from(InteractionRow)),
            db.scalar(select(func.count()).select_from(SessionRow)),
        )


def run_in_fresh_loop(coro):  # type: ignore[no-untyped-def]
    """asyncio.run() in its own thread: safe even if this thread has a running loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
