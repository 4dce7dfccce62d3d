"""SIGKILL of the gateway under concurrent multi-turn sessions on PostgreSQL: after a
restart every acknowledged answer is in the database exactly once, each session's turns
are numbered without gaps or repeats in the order the clients got them, and the
conversations continue in their sessions.

tests/gateway/test_faults.py covers one session with the database's writes blocked (the
answers can only be in the spool); here the writes run freely, so at the kill some
answers are committed, some are in the spool only and some were in flight, and the
replay must neither lose nor repeat any of them. Half the clients name their sessions
(X-Session-Id), half are stitched by conversation prefix.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.faults.helpers import setup_db, wait_rows
from tests.servers import gateway

pytestmark = pytest.mark.timeout(600)

CLIENTS = 6
TARGET = 24  # acknowledged answers before the kill


def _headers(key: str, i: int) -> dict[str, str]:
    h = {"Authorization": f"Bearer {key}"}
    if i % 2:
        h["X-Session-Id"] = f"named-{i}"
    return h


def _next(messages: list[dict[str, str]], body: dict[str, Any]) -> list[dict[str, str]]:
    answer = body["choices"][0]["message"]["content"]
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "More."},
    ]


def test_sigkill_under_concurrent_sessions_loses_and_repeats_nothing(pg_url, engine, tmp_path):
    factory, keys = setup_db(pg_url, CLIENTS)
    data_dir = tmp_path / "gw"
    lock = threading.Lock()
    acked: dict[int, list[str]] = defaultdict(list)
    convo: dict[int, list[dict[str, str]]] = {}
    attempts = defaultdict(int)
    stop = threading.Event()

    with gateway(data_dir, pg_url, engine.url) as gw:

        def client(i: int) -> None:
            messages = [{"role": "user", "content": f"Client {i}: name a color."}]
            with httpx.Client(timeout=120) as c:
                while not stop.is_set():
                    with lock:
                        attempts[i] += 1
                    try:
                        r = c.post(
                            gw.url + "/v1/chat/completions",
                            headers=_headers(keys[i], i),
                            json={"messages": messages, "max_tokens": 3, "temperature": 1.0},
                        )
                    except httpx.HTTPError:
                        return  # the gateway died under this call: not acknowledged
                    assert r.status_code == 200, r.text
                    messages = _next(messages, r.json())
                    with lock:
                        acked[i].append(r.json()["id"])
                        convo[i] = messages

        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(client, i) for i in range(CLIENTS)]
            deadline = time.monotonic() + 240
            while sum(map(len, acked.values())) < TARGET and time.monotonic() < deadline:
                time.sleep(0.05)
            gw.kill(signal.SIGKILL)
            stop.set()
            for f in futures:
                f.result()
    with lock:
        acknowledged = {i: list(ids) for i, ids in acked.items()}
        last = dict(convo)
    all_acked = {x for ids in acknowledged.values() for x in ids}
    assert len(all_acked) >= TARGET

    with gateway(data_dir, pg_url, engine.url) as gw:  # restart: the spool is replayed
        found = wait_rows(factory, all_acked, timeout=60)
        by_id = {r.id: r for r in found}
        assert all_acked <= set(by_id), sorted(all_acked - set(by_id))[:5]
        assert len(found) == len(by_id) <= sum(attempts.values())
        seqs: dict[str, list[int]] = defaultdict(list)
        for r in found:
            seqs[r.session_id].append(r.seq)
        for sid, s in seqs.items():
            assert sorted(s) == list(range(len(s))), (sid, sorted(s))
        print(
            f"SIGKILL: {len(all_acked)} acknowledged in {len(seqs)} sessions, "
            f"{len(all_acked - set(by_id))} lost, {len(found) - len(by_id)} duplicated, "
            f"{len(found) - len(all_acked)} recorded but not acknowledged (in flight)"
        )
        for i, ids in acknowledged.items():
            sessions = {by_id[x].session_id for x in ids}
            assert len(sessions) == 1, (i, sessions)  # one conversation, one session
            order = [by_id[x].seq for x in ids]
            assert order == sorted(order), (i, order)

        # each conversation continues in its session after the restart
        new: dict[int, str] = {}
        with httpx.Client(timeout=120) as c:
            for i, messages in last.items():
                r = c.post(
                    gw.url + "/v1/chat/completions",
                    headers=_headers(keys[i], i),
                    json={"messages": messages, "max_tokens": 2},
                )
                assert r.status_code == 200, r.text
                new[i] = r.json()["id"]
        found = wait_rows(factory, set(new.values()), timeout=60)
        by_id = {r.id: r for r in found}
        for i, iid in new.items():
            assert by_id[iid].session_id == by_id[acknowledged[i][-1]].session_id, i
            assert by_id[iid].seq > by_id[acknowledged[i][-1]].seq, i
