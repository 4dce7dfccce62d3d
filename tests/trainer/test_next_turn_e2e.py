"""The user's next message as a rating, end to end on PostgreSQL with real processes: the
gateway (real engine) records a session's second turn, queues the next-turn task after
its commit, a real ``rlgate worker`` runs it in its verify pool (the rules, and the judge
in ``next_turn`` mode through litellm's ``mock_response``), and the first answer's
``interactions.reward`` has the rating while the session is still open; the admin API's
credit view names where each rating came from."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key, ensure_project
from core.migrate import upgrade
from schemas.tables import FeedbackRow, InteractionRow, SessionRow
from tests.servers import REPO, Proc, engine_cmd, free_port, gateway, running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REDIS_DB = os.environ.get("RLGATE_TEST_NEXT_TURN_REDIS_DB", "14")
BROKER = f"redis://127.0.0.1:6379/{REDIS_DB}"
JUDGES = json.dumps({"mini": {"model": "openai/gpt-4o-mini"}})
RULES = {"name": "next_turn_rules"}
JUDGE = {"name": "judge", "judge": "mini", "mode": "next_turn"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    cmd = engine_cmd(port, "--context-length", "2048", "--max-running-requests", "4")
    with running(cmd, {}, log, port) as p:
        yield p


@pytest.fixture
def stack(pg_url: str, engine: Proc, tmp_path: Path) -> Iterator[tuple[Proc, Any, Path]]:
    """A gateway and a worker (trainer + verify pool) on a fresh PostgreSQL database."""
    import redis

    redis.Redis.from_url(BROKER).flushdb()  # no task left by an earlier run
    upgrade(pg_url)
    db = make_engine(pg_url)
    factory = session_factory(db)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RLGATE_DATABASE_URL": pg_url,
        "RLGATE_BROKER_URL": BROKER,
        "RLGATE_DATA_DIR": str(tmp_path / "worker-data"),
        "RLGATE_JUDGE_MOCK_RESPONSE": '{"label": "satisfied", "rationale": "the user thanked"}',
        "RLGATE_JUDGES": JUDGES,
        "RLGATE_VERIFY_WORKERS": "1",
    }
    log = tmp_path / "worker.log"
    try:
        with (
            gateway(tmp_path / "gw", pg_url, engine.url, broker_url=BROKER, judges=JUDGES) as gw,
            open(log, "wb") as fh,
        ):
            proc = subprocess.Popen(
                [sys.executable, "-m", "rlgate.cli", "worker",
                 "-n", f"next-turn-test-{secrets.token_hex(3)}@%h"],
                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                yield gw, factory, log
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        db.dispose()


def _two_turns(gw: Proc, key: str, first: str, reply: str) -> tuple[str, str]:
    """A session with two turns through the gateway; returns (session id, session key)."""
    r = httpx.post(
        gw.url + "/v1/sessions", headers={"Authorization": f"Bearer {key}"}, json={}, timeout=30
    )
    assert r.status_code == 201, r.text
    sid, session_key = r.json()["id"], r.json()["api_key"]
    messages: list[dict[str, Any]] = []
    for text in (first, reply):
        messages.append({"role": "user", "content": text})
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {session_key}"},
            json={"messages": messages, "max_tokens": 8, "temperature": 0.7},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        messages.append(
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
        )
    return sid, session_key


def _until(what: Any, log: Path, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out; worker log:\n{log.read_text()[-4000:]}")


def _turns(factory: Any, sid: str) -> list[InteractionRow]:
    with factory() as db:
        q = select(InteractionRow).where(InteractionRow.session_id == sid)
        return list(db.scalars(q.order_by(InteractionRow.seq)).all())


def _ratings(factory: Any, target: str) -> list[FeedbackRow]:
    with factory() as db:
        q = select(FeedbackRow).where(FeedbackRow.target_id == target)
        return list(db.scalars(q.order_by(FeedbackRow.rater)).all())


def test_the_next_message_rates_the_answer_before_it_while_the_session_is_open(
    stack: tuple[Proc, Any, Path],
) -> None:
    gw, factory, log = stack
    with transaction(factory) as db:
        ensure_project(db, "p1").settings = {"verifiers": [RULES]}
        ensure_project(db, "p2").settings = {"verifiers": [RULES, JUDGE]}
        _, key1 = create_key(db, "p1", "agent")
        _, key2 = create_key(db, "p2", "agent")
        _, admin = create_key(db, "p1", "admin")
        _, admin2 = create_key(db, "p2", "admin")

    # a correction: -0.5 from the rules on the first answer, the session still open
    sid, _ = _two_turns(gw, key1, "What is the capital of Australia?", "No, that's wrong.")
    first = _turns(factory, sid)[0].id
    (fb,) = _until(lambda: _ratings(factory, first), log)
    assert (fb.source, fb.rater, fb.reward) == ("next_turn", "rules:next_turn", -0.5)
    assert fb.comment == 'next turn: correction (cue: "no")'
    rewards = _until(lambda: [t.reward for t in _turns(factory, sid) if t.reward is not None], log)
    assert rewards == [-0.5]  # credit assigned at once; the last turn has no next message yet
    with factory() as db:
        assert db.get(SessionRow, sid).status == "open"  # type: ignore[union-attr]
    credit = httpx.get(
        f"{gw.url}/admin/api/sessions/{sid}/credit",
        headers={"Authorization": f"Bearer {admin}"},
        timeout=30,
    )
    assert credit.status_code == 200, credit.text
    t0 = credit.json()["turns"][0]
    assert (t0["interaction_id"], t0["reward"], t0["origins"]) == (first, -0.5, ["next_turn_rules"])
    assert t0["ratings"][0]["rater"] == "rules:next_turn"

    # thanks, in a project with the rules and the judge in next_turn mode: both rate it
    sid2, _ = _two_turns(gw, key2, "What is 2+2?", "Thanks!")
    first2 = _turns(factory, sid2)[0].id
    both = _until(lambda: r if len(r := _ratings(factory, first2)) == 2 else None, log)
    assert [(f.source, f.rater, f.reward) for f in both] == [
        ("judge", "judge:next_turn", 1.0),
        ("next_turn", "rules:next_turn", 1.0),
    ]
    assert both[0].rationale == "the user thanked"
    _until(lambda: _turns(factory, sid2)[0].reward == 1.0, log)
    credit2 = httpx.get(
        f"{gw.url}/admin/api/sessions/{sid2}/credit",
        headers={"Authorization": f"Bearer {admin2}"},
        timeout=30,
    ).json()
    assert credit2["turns"][0]["origins"] == ["next_turn", "next_turn_rules"]
    # each task ran once per turn: nothing was written twice
    assert len(_ratings(factory, first)) == 1 and len(_ratings(factory, first2)) == 2
