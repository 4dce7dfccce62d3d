"""Faults: SIGKILL under load loses nothing acknowledged, disconnects are recorded as
aborted, a dead engine is a 503, a saturated engine a 429; nothing half-recorded."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from sqlalchemy import func, select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.tables import InteractionRow
from tests.gateway.fake_engine import in_process_gateway
from tests.gateway.helpers import counts, wait_recorded
from tests.servers import free_port, gateway

MSG = [{"role": "user", "content": "Count to three."}]


def _setup_db(db_url: str) -> tuple[object, str]:
    upgrade(db_url)
    factory = session_factory(make_engine(db_url))
    with transaction(factory) as db:
        _, secret = create_key(db, "dur", "agent")
    return factory, secret


class _WriteBlock:
    """Holds the database's write lock (a real outage for writers; reads still work)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.conn = None

    def __enter__(self) -> _WriteBlock:
        if self.db_url.startswith("sqlite"):
            self.conn = sqlite3.connect(
                self.db_url.removeprefix("sqlite:///"), isolation_level=None, timeout=30
            )
            self.conn.execute("BEGIN EXCLUSIVE")
        else:
            self.conn = psycopg.connect(self.db_url)
            self.conn.execute("LOCK TABLE interactions IN EXCLUSIVE MODE")
        return self

    def release(self) -> None:
        if self.conn is not None:
            self.conn.rollback() if not self.db_url.startswith("sqlite") else self.conn.execute(
                "ROLLBACK"
            )
            self.conn.close()
            self.conn = None

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_sigkill_after_acknowledged_responses_loses_nothing(db_url, engine, tmp_path):
    # both spool modes: fdatasync per group commit (SQLite run) and the default page-cache
    # write (PostgreSQL run); a SIGKILL loses nothing acknowledged in either
    fsync = "true" if db_url.startswith("sqlite") else "false"
    factory, secret = _setup_db(db_url)
    headers = {"Authorization": f"Bearer {secret}", "X-Session-Id": "durability"}
    data_dir = tmp_path / "gw"
    n_target = 12
    acked: list[str] = []
    lock = threading.Lock()
    with gateway(data_dir, db_url, engine.url, spool_fsync=fsync) as gw:
        # open the session first (a write), then block all writes to interactions
        warm = httpx.post(
            gw.url + "/v1/chat/completions",
            headers=headers,
            timeout=120,
            json={"messages": MSG, "max_tokens": 2, "temperature": 0},
        )
        assert warm.status_code == 200
        acked.append(warm.json()["id"])
        wait_recorded(type("S", (), {"factory": factory})(), [acked[0]])
        block = _WriteBlock(db_url).__enter__()
        stop = threading.Event()

        def worker() -> None:
            with httpx.Client(timeout=120) as c:
                while not stop.is_set():
                    try:
                        r = c.post(
                            gw.url + "/v1/chat/completions",
                            headers=headers,
                            json={"messages": MSG, "max_tokens": 3, "temperature": 1.0},
                        )
                    except httpx.HTTPError:
                        return  # the gateway died under us: this one was not acknowledged
                    if r.status_code == 200:
                        with lock:
                            acked.append(r.json()["id"])

        with ThreadPoolExecutor(6) as pool:
            for _ in range(6):
                pool.submit(worker)
            deadline = time.monotonic() + 240
            while len(acked) < n_target + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            gw.kill(signal.SIGKILL)
            stop.set()
        with lock:
            acknowledged = list(acked)
        assert len(acknowledged) >= n_target + 1
        # the writes were blocked: the acknowledged records can only be in the spool
        with factory() as db:
            in_db = db.scalar(select(func.count()).select_from(InteractionRow))
        assert in_db == 1
        spooled = list((data_dir / "spool").glob("segment-*.jsonl"))
        assert spooled
        block.release()

    # restart: the spool is replayed into the database
    with gateway(data_dir, db_url, engine.url):
        with factory() as db:
            rows = db.execute(select(InteractionRow.id, InteractionRow.seq)).all()
        ids = [r.id for r in rows]
        assert set(acknowledged) <= set(ids)
        assert len(ids) == len(set(ids))  # none duplicated
        assert sorted(r.seq for r in rows) == list(range(len(rows)))  # one session, in order
        # the replayed segments are gone
        assert not [p for p in spooled if p.exists()]


def test_client_disconnect_records_aborted(stack):
    key = stack.key()
    with (
        httpx.Client(timeout=120) as c,
        c.stream(
            "POST",
            stack.gw.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
                "max_tokens": 400,
                "temperature": 1.0,
                "stream": True,
            },
        ) as r,
    ):
        assert r.status_code == 200
        iid = r.headers["x-rlgate-interaction-id"]
        n = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                n += 1
            if n >= 4:
                break
    (rec,) = wait_recorded(stack, [iid], timeout=30)
    assert rec.finish_reason == "abort"
    assert 0 < len(rec.completion_token_ids) < 400
    assert len(rec.completion_logprobs) == len(rec.completion_token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_engine_down_is_503_and_records_nothing(sqlite_url, tmp_path, engine, stream):
    factory, secret = _setup_db(sqlite_url)
    dead = f"http://127.0.0.1:{free_port()}"
    with in_process_gateway(tmp_path / "gw", sqlite_url, dead) as gw:
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            timeout=60,
            headers={"Authorization": f"Bearer {secret}"},
            json={"messages": MSG, "max_tokens": 4, "stream": stream},
        )
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "service_unavailable"
        assert counts(type("S", (), {"factory": factory})()) == (0, 0)


def test_failover_to_a_live_engine(sqlite_url, tmp_path, engine):
    factory, secret = _setup_db(sqlite_url)
    dead = f"http://127.0.0.1:{free_port()}"
    with in_process_gateway(tmp_path / "gw", sqlite_url, f"{dead},{engine.url}") as gw:
        for i in range(3):
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                timeout=120,
                headers={"Authorization": f"Bearer {secret}"},
                json={"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2},
            )
            assert r.status_code == 200, r.text


def test_saturated_engine_is_429_with_retry_after(sqlite_url, tmp_path, engine):
    factory, secret = _setup_db(sqlite_url)
    h = {"Authorization": f"Bearer {secret}"}
    with (
        in_process_gateway(
            tmp_path / "gw",
            sqlite_url,
            engine.url,
            max_in_flight_per_engine="1",
            engine_queue_wait_s="0",  # no waiting for a slot: 429 at once
        ) as gw,
        httpx.Client(timeout=120) as c,
        c.stream(
            "POST",
            gw.url + "/v1/chat/completions",
            headers=h,
            json={
                "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 300,
                "stream": True,
                "temperature": 1.0,
            },
        ) as long,
    ):
        assert long.status_code == 200
        second = c.post(
            gw.url + "/v1/chat/completions", headers=h, json={"messages": MSG, "max_tokens": 2}
        )
        assert second.status_code == 429
        assert second.headers["retry-after"] == "1"
        assert second.json()["error"]["type"] == "rate_limit_error"
