"""The demo's agents, one per task: how a training round runs and is rated, and how one
held-out question is answered greedily. Both talk to the gateway over real HTTP (the
OpenAI SDK and ``httpx``), as any agent owner's program would.

- :class:`ArithmeticAgent` (``--task arithmetic``): one request with ``n = group``
  answers per question; each answer is rated on its own (``interaction_id``).
- :class:`ToolAgent` (``--task tools``): ``group`` sibling sessions of one question run
  as tool loops (rlgate/demo_tools.py); each session gets one rating at its end
  (``session_id``) and is then ended. Nothing rates a single turn: the product's credit
  assignment carries the session's rating to its turns.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Protocol

import click
import httpx

from rlgate import demo_task, demo_tools
from rlgate.demo_http import http_client, openai_client


class Agent(Protocol):
    """What the demo loop needs from a task's agent."""

    http: httpx.AsyncClient
    unit: str  # what one rated thing is called in progress lines

    async def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        """A gateway call, retried on backpressure and dropped connections
        (rlgate/demo_http.py); None when the connection kept failing."""
        ...

    async def train_round(self) -> list[bool]:
        """One group on a training question, rated; whether each member was right."""
        ...

    async def answer(self, question: Any) -> tuple[str, bool]:
        """A held-out question answered greedily: (policy version, right)."""
        ...


class GatewayClient:
    def __init__(self, base: str, agent_key: str, seed: int) -> None:
        self.http = http_client(base, agent_key)
        self.rng = random.Random(seed)

    async def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        """One gateway call (retried by the transport: rlgate/demo_http.py); None when the
        connection kept failing."""
        try:
            return await self.http.request(method, url, **kwargs)
        except httpx.TransportError as e:
            click.echo(f"  ({method} {url} failed: {e!r}; going on)", err=True)
            return None

    async def rate(self, body: dict[str, Any]) -> None:
        r = await self.call("POST", "/feedback", json=body)
        if r is not None and r.status_code >= 400:
            click.echo(f"  (feedback refused: {r.status_code} {r.text[:200]})", err=True)


class ArithmeticAgent(GatewayClient):
    unit = "answers"

    def __init__(
        self, base: str, agent_key: str, seed: int, group: int, train: list[tuple[int, int]]
    ) -> None:
        super().__init__(base, agent_key, seed)
        self.client = openai_client(base, agent_key)
        self.group = group
        self.train = train

    async def ask(self, a: int, b: int, *, n: int, temperature: float) -> tuple[str, Any]:
        raw = await self.client.chat.completions.with_raw_response.create(
            model="rlgate-policy",
            messages=demo_task.messages(a, b),
            n=n,
            temperature=temperature,
            max_tokens=demo_task.MAX_TOKENS,
            seed=self.rng.randrange(2**31),
        )
        return raw.headers.get("x-rlgate-policy-version", "?"), raw.parse()

    async def train_round(self) -> list[bool]:
        a, b = self.rng.choice(self.train)
        _, resp = await self.ask(a, b, n=self.group, temperature=demo_task.SAMPLING_TEMPERATURE)
        right = []
        for choice in resp.choices:
            value = demo_task.score(choice.message.content, a + b)
            right.append(value == 1.0)
            target = resp.id if self.group == 1 else f"{resp.id}.{choice.index}"
            await self.rate(
                {
                    "interaction_id": target,
                    "value": value,
                    "scale": "scalar",
                    "source": "user",  # the only source a client writes
                    "rater": "exact-match",
                }
            )
        return right

    async def answer(self, question: tuple[int, int]) -> tuple[str, bool]:
        a, b = question
        version, resp = await self.ask(a, b, n=1, temperature=0.0)
        return version, demo_task.exact_match(resp.choices[0].message.content, a + b)


class ToolAgent(GatewayClient):
    unit = "sessions"

    def __init__(
        self,
        base: str,
        agent_key: str,
        seed: int,
        group: int,
        train: list[demo_tools.Question],
        known: demo_tools.Facts,
    ) -> None:
        super().__init__(base, agent_key, seed)
        self.group = group
        self.train = train
        self.known = known

    async def train_round(self) -> list[bool]:
        q = self.rng.choice(self.train)
        seeds = [self.rng.randrange(2**31) for _ in range(self.group)]
        episodes = await asyncio.gather(
            *[
                demo_tools.run_session(
                    self.http,
                    q,
                    self.known,
                    temperature=demo_task.SAMPLING_TEMPERATURE,
                    seed=s,
                )
                for s in seeds
            ]
        )
        for ep in episodes:
            await self.rate(
                {
                    "session_id": ep.session_id,
                    "value": 1.0 if ep.correct else 0.0,
                    "scale": "scalar",
                    "source": "user",  # the only source a client writes
                    "rater": "exact-match",
                }
            )
            await self.call("POST", f"/v1/sessions/{ep.session_id}/end")
        return [ep.correct for ep in episodes]

    async def answer(self, question: demo_tools.Question) -> tuple[str, bool]:
        ep = await demo_tools.run_session(self.http, question, self.known, temperature=0.0, seed=0)
        return ep.version, ep.correct
