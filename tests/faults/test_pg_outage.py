"""PostgreSQL stopped under load: the gateway keeps serving (answers go to the spool),
and when the database is back every acknowledged answer lands in it, once, in order.

The database is a private cluster started for this test (tests/faults/pgcluster.py), never
the shared server. The outage lasts RLGATE_FAULT_PG_OUTAGE_S seconds (default 30, the
figure issue #14 names). Load: concurrent multi-turn conversations from several agent
keys, sessions found by conversation prefix (each turn resends the history).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from tests.faults.helpers import setup_db, wait_rows
from tests.servers import gateway

pytestmark = pytest.mark.timeout(600)

OUTAGE_S = float(os.environ.get("RLGATE_FAULT_PG_OUTAGE_S", "30"))
CLIENTS = 4


def test_postgres_outage_serving_continues_and_everything_lands(private_pg, engine, tmp_path):
    with psycopg.connect(private_pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE rlgate")
    db_url = private_pg.url.rsplit("/", 1)[0] + "/rlgate"
    factory, keys = setup_db(db_url, CLIENTS)
    lock = threading.Lock()
    # per client: acknowledged interaction ids in the order they were answered
    acked: dict[int, list[str]] = defaultdict(list)
    phase = {"now": "before"}
    outcomes: Counter[tuple[str, str]] = Counter()
    failures: list[str] = []
    stop = threading.Event()

    with gateway(tmp_path / "gw", db_url, engine.url) as gw:

        def client(i: int) -> None:
            headers = {"Authorization": f"Bearer {keys[i]}"}
            messages = [{"role": "user", "content": f"Client {i}: count to three."}]
            with httpx.Client(timeout=120) as c:
                while not stop.is_set():
                    when = phase["now"]
                    r = c.post(
                        gw.url + "/v1/chat/completions",
                        headers=headers,
                        json={"messages": messages, "max_tokens": 3, "temperature": 1.0},
                    )
                    with lock:
                        outcomes[(when, str(r.status_code))] += 1
                    if r.status_code != 200:
                        with lock:
                            failures.append(f"{when}: HTTP {r.status_code} {r.text[:300]}")
                        time.sleep(0.2)
                        continue
                    body = r.json()
                    with lock:
                        acked[i].append(body["id"])
                    messages = [
                        *messages,
                        {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "And again."},
                    ]
                    if len(messages) > 9:  # a fresh conversation: a new session
                        messages = messages[:1]

        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(client, i) for i in range(CLIENTS)]
            time.sleep(3)
            phase["now"] = "outage"
            private_pg.stop("fast")
            time.sleep(OUTAGE_S)
            private_pg.start()
            phase["now"] = "after"
            time.sleep(3)
            stop.set()
            for f in futures:
                f.result()
        assert gw.proc.poll() is None

        all_acked = {x for ids in acked.values() for x in ids}
        found = wait_rows(factory, all_acked, timeout=60)

    # everything acknowledged landed, once
    by_id = {r.id: r for r in found}
    assert all_acked <= set(by_id), len(all_acked - set(by_id))
    assert len(found) == len(by_id)
    # each session's turns are numbered 0..n-1, and each client's answers in its order
    seqs: dict[str, list[int]] = defaultdict(list)
    for r in found:
        seqs[r.session_id].append(r.seq)
    for sid, s in seqs.items():
        assert sorted(s) == list(range(len(s))), (sid, sorted(s))
    for ids in acked.values():
        order = [(by_id[x].session_id, by_id[x].seq) for x in ids]
        for (s1, q1), (s2, q2) in zip(order, order[1:], strict=False):
            assert s1 != s2 or q2 > q1, (s1, q1, q2)
    print(
        f"PostgreSQL down {OUTAGE_S:.0f} s: calls by phase and status {dict(outcomes)}; "
        f"{len(all_acked)} acknowledged, {len(all_acked - set(by_id))} lost after recovery"
    )
    # serving continued through the outage: every call answered
    assert outcomes[("outage", "200")] >= CLIENTS, (dict(outcomes), failures[:3])
    assert not failures, (dict(outcomes), failures[:3])
