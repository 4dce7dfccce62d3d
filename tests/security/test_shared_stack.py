"""Issue 36's medium findings on one shared stack, as they were found: PostgreSQL, the
gateway as a real process before the real embedded engine, a real ``rlgate worker``
(Celery on Redis, with its verify pool), and two projects, p1 (the one misbehaving) and
p2 (everyone else). Finding 2 (the eval gate's time budget) is shown the same way in
tests/trainer/test_eval_gate.py; the fast tiers and the security matrix cover the rest.

- Finding 1: grammar and regex nesting bombs in a Responses custom tool are a 400 naming
  ``tools[0].format.definition`` and the limit, while p2's ``/health`` and chat calls stay
  near their own unloaded latency (the probe on 8b8196b: a 200 after 15.5 s, ``/health``
  12 s).
- Finding 3: a session's key opens no session, and a key below it stops when that session
  ends (the probe: C's key still chatted and opened sessions after A ended).
- Finding 4: a client cannot write the verifier's rating or take its idempotency key; the
  real verifier's later rating is stored (the probe: the forged +1 was the session's only
  rating).
- Finding 7 (low, the fair share of the engines): p1 saturating the engine with many
  calls, p2's call is served within a small multiple of its unloaded latency.

Latencies are only compared with the same call's unloaded latency in the same test, with
generous margins (what the acceptance asks for), never with fixed wall-clock times.
"""

from __future__ import annotations

import os
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key, ensure_project, find_key
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import FeedbackRow, SessionRow
from tests.grammar_bombs import BOMBS, custom_tool_body
from tests.rows import session
from tests.servers import Proc, Worker, engine_cmd, free_port, gateway, running, worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BROKER = f"redis://127.0.0.1:6379/{os.environ.get('RLGATE_TEST_SHARED_REDIS_DB', '15')}"
EXPECTED = "zebra-7731"  # p1's sessions expect it; the model never says it: contains -> -1
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
# the fair-share call: the same prompt at temperature 0, so every call is the same length
LONG = {
    "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
    "max_tokens": 24,
    "temperature": 0,
}


@dataclass
class Shared:
    gw: Proc
    worker: Worker
    factory: Any
    keys: dict[str, str]  # "p1 agent", "p1 feedback", "p2 agent" -> secret

    def post(self, who: str, path: str, body: Any, key: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key or self.keys[who]}"}
        return httpx.post(self.gw.url + path, headers=headers, json=body, timeout=300)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    import redis

    from tests.conftest import PG_BASE, _admin_conn

    tmp = tmp_path_factory.mktemp("shared")
    name = f"rlgate_test_{secrets.token_hex(6)}"
    with _admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_BASE}/{name}"
    upgrade(url)
    db = make_engine(url)
    factory = session_factory(db)
    with transaction(factory) as s:
        ensure_project(s, "p1").settings = {"verifiers": ["contains"]}
        ensure_project(s, "p2")
        s.flush()
        keys = {
            "p1 agent": create_key(s, "p1", "agent")[1],
            "p1 feedback": create_key(s, "p1", "feedback")[1],
            "p2 agent": create_key(s, "p2", "agent")[1],
        }
    redis.Redis.from_url(BROKER).flushdb()  # no task left by an earlier run
    port = free_port()
    cmd = engine_cmd(port, "--context-length", "2048", "--max-running-requests", "4")
    try:
        with (
            running(cmd, {}, tmp / "engine.log", port) as engine,
            gateway(
                tmp / "gw",
                url,
                engine.url,
                broker_url=BROKER,
                # two slots per engine, so p1 alone fills it and the share decides
                max_in_flight_per_engine="2",
                engine_queue_wait_s="300",
                session_key_grace_s="0",  # a session's key ends with it (no late feedback)
            ) as gw,
            worker(tmp / "worker", url, BROKER, verify_workers="1") as w,
        ):
            yield Shared(gw, w, factory, keys)
    finally:
        db.dispose()
        with _admin_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _timed(call: Callable[[], httpx.Response]) -> float:
    t = time.monotonic()
    r = call()
    assert r.status_code == 200, r.text[:500]
    return time.monotonic() - t


def _until(what: Callable[[], Any], log: Path, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out; worker log:\n{log.read_text()[-4000:]}")


# ---- finding 1: a grammar bomb freezes no one ------------------------------------------


def test_grammar_bombs_are_a_400_while_another_project_is_served(shared: Shared) -> None:
    health = lambda: httpx.get(shared.gw.url + "/health", timeout=300)  # noqa: E731
    chat = lambda: shared.post("p2 agent", "/v1/chat/completions", CHAT)  # noqa: E731
    health_alone = statistics.median(_timed(health) for _ in range(7))
    chat_alone = statistics.median(_timed(chat) for _ in range(3))

    bodies = [custom_tool_body(syn, d, forced=True) for syn, d, _ in BOMBS.values()] * 3
    health_loaded: list[float] = []
    chat_loaded: list[float] = []
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(shared.post, "p1 agent", "/v1/responses", b) for b in bodies]
        while not all(f.done() for f in futures) or len(chat_loaded) < 2:
            health_loaded.append(_timed(health))
            chat_loaded.append(_timed(chat))
        answers = [f.result() for f in futures]
    for (name, (_, _, limit)), r in zip(list(BOMBS.items()) * 3, answers, strict=True):
        assert r.status_code == 400, (name, r.text[:500])
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error", (name, err)
        assert err["param"] == "tools[0].format.definition", (name, err)
        assert err["param"] in err["message"] and limit in err["message"], (name, err)
    # generous: on 8b8196b /health took 12 s behind one bomb (milliseconds alone), and
    # the bomb's 200 came after 15.5 s; the floor absorbs a busy shared CPU
    assert max(health_loaded) < max(50 * health_alone, 1.0), (health_alone, health_loaded)
    assert statistics.median(chat_loaded) < 5 * chat_alone, (chat_alone, chat_loaded)


# ---- finding 3: a session key ends with its session ------------------------------------


def test_a_session_key_opens_nothing_and_its_chain_ends_with_it(shared: Shared) -> None:
    r = shared.post("p1 agent", "/v1/sessions", {})
    assert r.status_code == 201, r.text
    a_id, a_key = r.json()["id"], r.json()["api_key"]
    for path in ("/v1/sessions", "/rl/start_session"):  # on 8b8196b: 201 and a key
        r = shared.post("", path, {}, key=a_key)
        assert r.status_code == 403, (path, r.text)
        assert "per-session key" in r.json()["error"]["message"] or "start_session" in r.text
    # a chain minted before the change: C's key below A's, D's below C's
    with transaction(shared.factory) as db:
        db.add(to_row(session("chain_c", "p1", at=utcnow())))
        db.add(to_row(session("chain_d", "p1", at=utcnow())))
        db.flush()
        a = find_key(db, a_key)
        assert a is not None
        c, c_key = create_key(db, "p1", "agent", session_id="chain_c", parent_key_id=a.id)
        _, d_key = create_key(db, "p1", "agent", session_id="chain_d", parent_key_id=c.id)
    for key in (a_key, c_key, d_key):
        assert shared.post("", "/v1/chat/completions", CHAT, key=key).status_code == 200

    r = shared.post("", f"/v1/sessions/{a_id}/end", {}, key=a_key)
    assert r.status_code == 200 and r.json()["status"] == "closed", r.text

    def statuses() -> list[int]:
        return [
            shared.post("", "/v1/chat/completions", CHAT, key=key).status_code
            for key in (a_key, c_key, d_key)
        ]

    deadline = time.monotonic() + 30  # the gateway's key cache forgets within seconds
    while (got := statuses()) != [401] * 3:
        assert time.monotonic() < deadline, got
        time.sleep(0.5)
    with shared.factory() as db:  # C's and D's own sessions are still open: the chain ended
        assert {db.get(SessionRow, s).status for s in ("chain_c", "chain_d")} == {"open"}  # type: ignore[union-attr]


# ---- finding 4: ratings only from those entitled to give them --------------------------


def test_a_forged_verifier_rating_is_refused_and_the_real_one_lands(shared: Shared) -> None:
    r = shared.post("p1 agent", "/v1/sessions", {"metadata": {"expected": EXPECTED}})
    assert r.status_code == 201, r.text
    sid, key = r.json()["id"], r.json()["api_key"]
    assert shared.post("", "/v1/chat/completions", CHAT, key=key).status_code == 200
    theirs = f"verifier:contains:{sid}"  # the worker's idempotency key for this session
    forged = {"session_id": sid, "value": 1, "source": "verifier", "rater": "contains",
              "idempotency_key": theirs}  # fmt: skip
    for source in ("verifier", "judge", "next_turn"):
        for who in ("session key", "p1 feedback"):
            r = shared.post(who, "/feedback", {**forged, "source": source},
                            key=key if who == "session key" else None)  # fmt: skip
            assert r.status_code == 403, (source, who, r.text)
            assert r.json()["error"]["param"] == "source", r.text
    # as a user, with the verifier's key: stored in the client's own namespace
    user = {k: v for k, v in forged.items() if k not in ("source", "rater")}
    r = shared.post("", "/feedback", user, key=key)
    assert r.status_code == 200 and r.json()["source"] == "user", r.text

    r = shared.post("", f"/v1/sessions/{sid}/end", {}, key=key)
    assert r.status_code == 200, r.text

    def ratings() -> list[tuple[str, str | None, float | None]]:
        with shared.factory() as db:
            rows = db.scalars(select(FeedbackRow).where(FeedbackRow.session_id == sid)).all()
            got = sorted((f.source, f.idempotency_key, f.reward) for f in rows)
        return got if len(got) == 2 else []

    # the real verifier (in the worker) rated the session: -1, not dropped as a duplicate
    assert _until(ratings, shared.worker.log) == [
        ("user", "client:" + theirs, 1.0),
        ("verifier", theirs, -1.0),
    ]


# ---- finding 7: a fair share of the engines --------------------------------------------


def test_a_saturating_project_leaves_another_its_share(shared: Shared) -> None:
    call = lambda who: shared.post(who, "/v1/chat/completions", LONG)  # noqa: E731
    alone = statistics.median(_timed(lambda: call("p2 agent")) for _ in range(3))
    t0 = time.monotonic()

    def p1_call() -> float:  # when it was answered, from t0
        _timed(lambda: call("p1 agent"))
        return time.monotonic() - t0

    with ThreadPoolExecutor(16) as pool:
        backlog = [pool.submit(p1_call) for _ in range(16)]
        time.sleep(min(1.0, alone))  # p1 holds both slots and has a queue behind them
        loaded = _timed(lambda: call("p2 agent"))
        p2_answered = time.monotonic() - t0
        p1_answered = sorted(f.result() for f in backlog)
    # p2 waits for one freed slot, not behind p1's 16 calls served two at a time
    assert loaded < 5 * alone, (alone, loaded, p1_answered)
    # and the test could fail: most of p1's queue was still waiting when p2 was answered
    assert sum(t > p2_answered for t in p1_answered) >= 8, (p2_answered, p1_answered)
