"""A conversation and its items are usable the moment the client has them, on any replica.

Two gateway processes on one PostgreSQL database, both with ``RLGATE_UNKNOWN_ID_WAIT_S=0``
(nothing polls for an id it does not find). Eight agents at once, each through one
gateway: create a conversation with an item, then at once on the *other* gateway read the
conversation and its items; then a ``responses.create`` with the conversation (streamed
for half of them) and at once, on the other gateway, the items it appended and the
response's input items. The expectation: zero 404s, every item there.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.servers import gateway

pytestmark = pytest.mark.timeout(600)

AGENTS = 8


def test_conversations_are_readable_at_once_on_another_replica(pg_url, engine, tmp_path):
    upgrade(pg_url)
    db_engine = make_engine(pg_url)
    with transaction(session_factory(db_engine)) as db:
        keys = [create_key(db, "p1", "agent")[1] for _ in range(AGENTS)]
    lock = threading.Lock()
    outcomes: Counter[str] = Counter()
    failures: list[str] = []

    with ExitStack() as stack:
        gws = [
            stack.enter_context(
                gateway(tmp_path / f"gw{i}", pg_url, engine.url, unknown_id_wait_s="0")
            )
            for i in range(2)
        ]

        def check(name: str, r: httpx.Response) -> Any:
            with lock:
                outcomes[f"{name} {r.status_code}"] += 1
                if r.status_code != 200:
                    failures.append(f"{name}: {r.status_code} {r.text[:300]}")
            stream = r.headers.get("content-type", "").startswith("text/event-stream")
            return r.json() if r.status_code == 200 and not stream else None

        def agent(i: int) -> None:
            here, there = gws[i % 2].url, gws[(i + 1) % 2].url
            item = {"type": "message", "role": "user", "content": f"Agent {i}: hello."}
            with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {keys[i]}"}) as c:
                conv = check("create", c.post(here + "/v1/conversations", json={"items": [item]}))
                cid = conv["id"]
                check("get", c.get(f"{there}/v1/conversations/{cid}"))
                listed = check("items", c.get(f"{there}/v1/conversations/{cid}/items"))
                if listed is not None:
                    assert len(listed["data"]) == 1
                    one = listed["data"][0]["id"]
                    check("item", c.get(f"{there}/v1/conversations/{cid}/items/{one}"))
                body = {
                    "model": "m",
                    "conversation": cid,
                    "input": "Name a colour.",
                    "max_output_tokens": 4,
                    "stream": i % 2 == 1,
                }
                if body["stream"]:
                    with c.stream("POST", here + "/v1/responses", json=body) as r:
                        r.read()
                else:
                    r = c.post(here + "/v1/responses", json=body)
                check("respond", r)
                if body["stream"]:  # read to its end: the last event is the completed one
                    assert '"response.completed"' in r.text or "response.incomplete" in r.text
                rid = r.headers.get("x-rlgate-interaction-id")
                after = check("items-after", c.get(f"{there}/v1/conversations/{cid}/items"))
                if after is not None:
                    assert [x["role"] for x in reversed(after["data"])] == [
                        "user",
                        "user",
                        "assistant",
                    ]
                check("input-items", c.get(f"{there}/v1/responses/{rid}/input_items"))

        with ThreadPoolExecutor(AGENTS) as pool:
            list(pool.map(agent, range(AGENTS)))
    db_engine.dispose()

    assert not failures, (failures, outcomes)
    assert sum(outcomes.values()) == AGENTS * 7, outcomes
