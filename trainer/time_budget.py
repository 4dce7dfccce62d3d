"""A deadline for work that runs inside a training task (the eval gate's scoring).

The eval gate scores each eval prompt with the project's verifier inside the training
task; the trainer runs one task at a time, so a slow verifier (a granted ``command``)
would hold every project's training. :func:`within` sets a deadline for the work it
wraps; :func:`remaining` is what is left of it (None: no deadline), and the command
verifier waits at most that long before it kills its process group and raises
:class:`OverBudget`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("rlgate_time_budget", default=None)


class OverBudget(Exception):
    """The work ran past its time budget."""


@contextmanager
def within(seconds: float | None) -> Iterator[None]:
    """Run the block under a deadline ``seconds`` from now (None: none)."""
    token = _DEADLINE.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left before the deadline (0 when past it), or None without one."""
    deadline = _DEADLINE.get()
    return None if deadline is None else max(0.0, deadline - time.monotonic())
