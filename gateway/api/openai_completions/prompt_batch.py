"""Several prompts of one call (the Completions API's ``prompt`` list) as one unit.

Every prompt is generated (``n`` choices each) and the batch is recorded in one
``record_many`` (one spool append, one transaction) only once every prompt finished. If
any prompt fails (the engine refuses it, fails mid-way, or the client leaves a stream),
the others are cancelled and nothing of the batch is recorded: no half-recorded batch. A
lone prompt keeps the behaviour of the other APIs (a stream the client leaves is recorded
as ``abort``, what the client got).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.handler import open_stream, replay
from gateway.call.pipeline import Pipeline, Prepared, StreamEvent
from gateway.call.request import Completion

Opened = tuple[Any, StreamEvent | None]  # a prompt's event stream and its first event


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))


async def complete(pipeline: Pipeline, preps: list[Prepared]) -> list[list[Completion]]:
    """Generate every prompt's choices, then record them all as one unit; the first
    failure cancels the rest and is raised, with nothing recorded."""
    tasks = [asyncio.create_task(pipeline.run(p)) for p in preps]
    try:
        results = list(await asyncio.gather(*tasks))
    except BaseException:
        await _cancel(tasks)
        raise
    await pipeline.record_many(list(zip(preps, results, strict=True)))
    return results


async def open_all(pipeline: Pipeline, preps: list[Prepared]) -> list[Opened]:
    """Start every prompt's stream, all at once, before any byte is sent (an engine error
    is still a proper HTTP error); on a failure the ones that started are closed,
    unrecorded, and the first error is raised."""
    keep_partial = len(preps) == 1
    tasks = [asyncio.create_task(open_stream(pipeline, p, keep_partial)) for p in preps]
    try:
        done = await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:  # cancelled (the client left): close what had started
        await _cancel(tasks)
        done = [t.exception() or t.result() if not t.cancelled() else None for t in tasks]
        await _close([r for r in done if isinstance(r, tuple)])
        raise
    failed = [r for r in done if isinstance(r, BaseException)]
    if not failed:
        return list(done)  # type: ignore[arg-type]
    await _close([r for r in done if isinstance(r, tuple)])
    raise failed[0]


async def _close(opened: list[Opened]) -> None:
    for events, _ in opened:
        await events.aclose()


async def merged(opened: list[Opened]) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Every prompt's events as they come, tagged with the prompt's index. The first
    error is raised; leaving early (or an error) closes every prompt's stream, which
    aborts its engine requests."""
    queue: asyncio.Queue[tuple[int, StreamEvent] | Exception | None] = asyncio.Queue()

    async def pump(k: int, events: Any, first: StreamEvent | None) -> None:
        try:
            async with contextlib.aclosing(replay(first, events)) as evs:
                async for ev in evs:
                    queue.put_nowait((k, ev))
        except Exception as e:  # noqa: BLE001 - forwarded to the consumer
            queue.put_nowait(e)
            return
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(k, ev, first)) for k, (ev, first) in enumerate(opened)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        await _cancel(tasks)
