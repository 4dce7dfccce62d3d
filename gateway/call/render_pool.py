"""Where chat-template rendering and tokenization run, and the tools' grammars are read
and converted (gateway/call/forced_tools.py ``tool_grammar``): a bounded thread pool, under a
time limit, so the event loop only routes requests.

Rendering (Jinja) and tokenizing are CPU work that grows with the prompt; on the event
loop one long prompt would stall every other request, ``/health`` included. Here at most
``workers`` run at once; a job that has not finished ``timeout_s`` after it was submitted
(waiting for a worker included) is answered with a 503 in the client's format. A job
still waiting for a worker is dropped at that point; one already running cannot be
interrupted (the tokenizer is native code) and keeps its worker until it returns, its
result discarded. Prompts are bounded before they get here (request body size, prompt
characters; see gateway/edge/body_limit.py and templating.check_prompt_chars), so a job that runs
into the limit means the gateway is overloaded, not that the prompt is malformed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from core.errors import APIError

T = TypeVar("T")


class RenderPool:
    def __init__(self, workers: int = 4, timeout_s: float = 30.0) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlgate-render")

    async def run(
        self,
        fn: Callable[..., T],
        *args: object,
        what: str = "rendering and tokenizing the prompt",
    ) -> T:
        """``fn(*args)`` on a pool thread; a 503 (Retry-After: 1) if it takes longer than
        ``timeout_s`` (the message says it was ``what``). Errors ``fn`` raises (a 400 for a
        template that cannot render the messages) pass through unchanged."""
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._pool, fn, *args)
        try:
            return await asyncio.wait_for(job, self.timeout_s)
        except TimeoutError:
            raise APIError(
                503,
                f"{what} took longer than {self.timeout_s:g} s (at most {self.workers} such "
                "jobs run at once, so the gateway may be busy with long prompts); retry "
                "shortly, or shorten the request",
                headers={"Retry-After": "1"},
            ) from None

    def close(self) -> None:
        """Stop taking jobs; jobs still waiting are cancelled, running ones finish."""
        self._pool.shutdown(wait=False, cancel_futures=True)
