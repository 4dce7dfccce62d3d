"""Every id a call hands out is usable the moment the client has it, on any replica.

Two gateway processes on one PostgreSQL database, as behind a load balancer. Eight
agents make 40 calls in all (Responses and Chat Completions, streamed and not, some with
``n=2`` so the interaction id names a group) through one gateway, and the moment each
answer is complete (the JSON body, or the stream's last event) they use its ids on the
*other* gateway:

- ``POST /feedback`` by ``session_id`` and by ``interaction_id`` (a group id for n=2);
- ``GET /v1/responses/{id}`` and ``GET /v1/sessions/{id}``;
- the next Responses call continues the last one with ``previous_response_id``.

Both gateways run with ``RLGATE_UNKNOWN_ID_WAIT_S=0``: the other replica never polls for
an id it does not find, so what is checked is that the answer was released only after the
rows it names were committed (gateway.recording.recorder commit tickets). The expectation: zero
404s, and every rating stored.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.tables import FeedbackRow
from tests.servers import gateway

pytestmark = pytest.mark.timeout(600)

AGENTS = 8
CALLS_PER_AGENT = 5  # 40 calls
KINDS = ("responses", "responses-stream", "chat", "chat-stream-n2", "responses")


def _complete(c: httpx.Client, url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    """The answer, read to its end (a stream: to its last event)."""
    if not body.get("stream"):
        return c.post(url + path, json=body)
    with c.stream("POST", url + path, json=body) as r:
        r.read()
        return r


def _last_event(r: httpx.Response) -> str:
    lines = [x for x in r.text.splitlines() if x.startswith("data: ")]
    return lines[-1] if lines else ""


def test_ids_are_usable_at_once_on_another_replica(pg_url, engine, tmp_path):
    upgrade(pg_url)
    db_engine = make_engine(pg_url)
    factory = session_factory(db_engine)
    with transaction(factory) as db:
        keys = [create_key(db, "p1", "agent")[1] for _ in range(AGENTS)]
    lock = threading.Lock()
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    rated = 0

    with ExitStack() as stack:
        gws = [
            stack.enter_context(
                gateway(tmp_path / f"gw{i}", pg_url, engine.url, unknown_id_wait_s="0")
            )
            for i in range(2)
        ]

        def agent(i: int) -> int:
            headers = {"Authorization": f"Bearer {keys[i]}"}
            previous: str | None = None
            stored = 0
            with httpx.Client(timeout=120, headers=headers) as c:
                for k in range(CALLS_PER_AGENT):
                    kind = KINDS[(i + k) % len(KINDS)]
                    here, there = gws[(i + k) % 2].url, gws[(i + k + 1) % 2].url
                    prompt = f"Agent {i}, call {k}: name a colour."
                    if kind.startswith("responses"):
                        body: dict[str, Any] = {"input": prompt, "max_output_tokens": 4}
                        if previous:
                            body["previous_response_id"] = previous
                        path = "/v1/responses"
                    else:
                        body = {"messages": [{"role": "user", "content": prompt}]}
                        body |= {"max_tokens": 4, "n": 2}
                        path = "/v1/chat/completions"
                    body |= {"model": "m", "stream": "stream" in kind}
                    r = _complete(c, here, path, body)
                    with lock:
                        outcomes[f"call {r.status_code}"] += 1
                    if r.status_code != 200:  # previous_response_id unknown there: a 404
                        with lock:
                            failures.append(f"{kind} call: {r.status_code} {r.text[:200]}")
                        previous = None
                        continue
                    if body["stream"]:  # the answer was read to its end
                        last = _last_event(r)
                        assert (
                            "[DONE]" in last
                            or "response.completed" in last
                            or "response.incomplete" in last
                        ), last
                    iid = r.headers["x-rlgate-interaction-id"]
                    sid = r.headers["x-rlgate-session-id"]
                    # at once, on the other replica; which goes first rotates
                    checks: list[tuple[str, str, str, dict[str, Any] | None]] = [
                        ("feedback-session", "POST", "/feedback", {"session_id": sid, "value": 1}),
                        (
                            "feedback-interaction",
                            "POST",
                            "/feedback",
                            {"interaction_id": iid, "value": 0.5},
                        ),
                        ("get-session", "GET", f"/v1/sessions/{sid}", None),
                    ]
                    if kind.startswith("responses"):
                        checks.append(("get-response", "GET", f"/v1/responses/{iid}", None))
                        previous = iid
                    turn = (i + k) % len(checks)
                    for name, method, route, payload in checks[turn:] + checks[:turn]:
                        resp = c.request(method, there + route, json=payload)
                        with lock:
                            outcomes[f"{name} {resp.status_code}"] += 1
                            if resp.status_code != 200:
                                failures.append(f"{kind} {name}: {resp.status_code} {resp.text}")
                        if name.startswith("feedback") and resp.status_code == 200:
                            stored += 1
                        if name == "get-response" and resp.status_code == 200:
                            assert resp.json()["id"] == iid
            return stored

        with ThreadPoolExecutor(AGENTS) as pool:
            rated = sum(pool.map(agent, range(AGENTS)))

    print("\nread-after-write outcomes:", json.dumps(dict(sorted(outcomes.items()))))
    assert not failures, f"{len(failures)} of {sum(outcomes.values())} failed: {failures[:5]}"
    assert rated == 2 * AGENTS * CALLS_PER_AGENT
    with factory() as db:
        assert db.scalar(select(func.count()).select_from(FeedbackRow)) == rated
    db_engine.dispose()
