"""Several processes of each kind on one database and broker, started by the code of
`rlgate up --engines 2 --gateways 2 --workers 2` (rlgate/up.py's launch): two embedded
engines, two gateways (each routing over both engines) and two Celery workers (the first
with the schedule), on PostgreSQL and a Redis database of the test's own, loopback only.

One scenario, in order (each step needs the one before):
1. a named session's second turn, sent to the other gateway, goes to the same engine as
   its first (rendezvous hashing on the session id) and is served from that engine's
   prefix cache (``prompt_tokens_details.cached_tokens > 0``);
2. ratings sent to gateway B for answers gateway A served are stored;
3. one engine is SIGKILLed under concurrent calls to both gateways: every call started
   after the kill succeeds on the other engine, and every call acknowledged with 200 is
   recorded (0 lost);
4. the worker running a training run is SIGKILLed (its process group) mid-run; the other
   worker takes the project over: its run marks the dead one failed ("worker lost"),
   trains on the same samples and publishes, and the engine still alive serves the new
   adapter (the dead one is skipped, trainer/publish.py);
5. the killed engine is started again, without adapters: calls to both gateways all
   succeed on the serving version, the gateways load it into the restarted engine
   (gateway/engines/adapter_sync.py, before the trainer's tick would), and it serves again.

The figures are printed (``-s``); bench/README.md quotes one run.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from core.settings import Settings
from rlgate.up import Shape, launch
from schemas.tables import (
    FeedbackRow,
    InteractionRow,
    PolicyVersionRow,
    ProjectRow,
    TrainingRunRow,
)
from tests.faults.helpers import engine_adapters, wait_rows
from tests.faults.stack import (
    Load,
    chat,
    consecutive_free,
    sigkill,
    wait_up,
    worker_ready,
)
from tests.servers import MODEL_CACHE, REPO
from tests.trainer.helpers import make_project, rewards, set_training
from tests.trainer.test_e2e import TRAINING, _wait_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REDIS_DB = 11  # a database of its own on the test Redis
BEFORE_KILL = 8  # acknowledged calls before the engine is killed
AFTER_KILL = 8  # calls started after the kill, all of which must succeed
CLIENTS = 4
RESTART_CALLS = 12  # calls (fresh sessions) after the killed engine is back


def _row(factory: Any, iid: str) -> InteractionRow:
    wait_rows(factory, {iid}, timeout=30)
    with factory() as db:
        row = db.get(InteractionRow, iid)
    assert row is not None, iid
    return row


def test_two_engines_two_gateways_two_workers(pg_url: str, tmp_path: Path) -> None:
    from trainer import runs
    from trainer.celery_base import make_celery

    t0 = time.monotonic()
    upgrade(pg_url)
    factory = session_factory(make_engine(pg_url))
    pid = make_project(
        factory,
        {**TRAINING, "num_minibatches": 1, "stale_after_s": 5.0, "heartbeat_s": 1.0},
    )
    with transaction(factory) as db:
        _, key = create_key(db, pid, "agent")
        # no run from the schedule (the first worker's beat): the test starts each run
        # itself (a manual run trains a paused project)
        db.get(ProjectRow, pid).training_paused = True
    data = tmp_path / "stack"
    data.mkdir()
    (data / "models").symlink_to(MODEL_CACHE / "models")  # no second conversion
    broker = f"redis://127.0.0.1:6379/{REDIS_DB}"
    redis.Redis.from_url(broker).flushdb()  # this test's own Redis database
    engine_key = secrets.token_urlsafe(16)
    settings = Settings(data_dir=data, database_url=pg_url, broker_url=broker)
    port = consecutive_free(2)
    engine_port = consecutive_free(2)
    # `rlgate up --engines 2 --gateways 2 --workers 2`, as run_up starts it
    stack = launch(
        settings,
        port,
        engine_port,
        trainer=True,
        extra_env={
            "PYTHONPATH": str(REPO),
            "RLGATE_DATABASE_URL": pg_url,
            "RLGATE_BROKER_URL": broker,
            "RLGATE_ENGINE_API_KEY": engine_key,
            "RLGATE_LOG_LEVEL": "info",
        },
        engine_args=(
            *("--context-length", "1024", "--max-running-requests", "4"),
            *("--max-lora-rank", "16", "--max-loaded-loras", "4", "--log-level", "warning"),
        ),
        shape=Shape(engines=2, gateways=2, workers=2),
    )
    restarted: subprocess.Popen | None = None
    try:
        by_name = {c.name: c for c in stack.children}
        engines = [by_name["engine1"], by_name["engine2"]]
        assert {"gateway1", "gateway2"} <= set(by_name)
        workers = [by_name["worker1"], by_name["worker2"]]
        gw_urls = stack.bases
        assert stack.engine_urls == [f"http://127.0.0.1:{engine_port + i}" for i in (0, 1)]
        assert gw_urls == [f"http://127.0.0.1:{port + i}" for i in (0, 1)]
        for w in workers:
            worker_ready(w)
        started_s = time.monotonic() - t0
        gw_a, gw_b = gw_urls
        auth = {"Authorization": f"Bearer {engine_key}"}

        with httpx.Client(timeout=120) as c:
            # 1. session affinity across gateways, and the prefix cache on the second turn
            messages = [{"role": "user", "content": "Describe a cat in one sentence."}]
            body = {"messages": messages, "max_tokens": 8, "temperature": 0.0}
            r1 = chat(c, gw_a, key, body, sid="affine-1")
            assert r1.status_code == 200, r1.text
            first = _row(factory, r1.json()["id"])
            answer = r1.json()["choices"][0]["message"]["content"]
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "And a dog?"},
            ]
            body = {"messages": messages, "max_tokens": 8, "temperature": 0.0}
            r2 = chat(c, gw_b, key, body, sid="affine-1")
            assert r2.status_code == 200, r2.text
            second = _row(factory, r2.json()["id"])
            cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert second.session_id == first.session_id
            assert second.seq == first.seq + 1
            assert second.engine_url == first.engine_url, (first.engine_url, second.engine_url)
            assert cached > 0 and second.usage["cached_tokens"] == cached, r2.json()["usage"]

            # 2. gateway A serves two groups of two, gateway B takes their ratings
            rated = []
            for q in ("What is 2+2?", "Name a color."):
                body = {
                    "messages": [{"role": "user", "content": q}],
                    "n": 2,
                    "temperature": 1.0,
                    "max_tokens": 8,
                }
                r = chat(c, gw_a, key, body)
                assert r.status_code == 200, r.text
                ids = [f"{r.json()['id']}.{i}" for i in (0, 1)]
                for iid, value in zip(ids, (1, 0), strict=True):
                    fb = c.post(
                        gw_b + "/feedback",
                        headers={"Authorization": f"Bearer {key}"},
                        json={"interaction_id": iid, "value": value, "scale": "binary"},
                    )
                    assert fb.status_code == 200, fb.text
                rated += ids
            stored_rewards = rewards(factory, rated)
            with factory() as db:
                stored = db.scalars(
                    select(FeedbackRow.target_id).where(FeedbackRow.project_id == pid)
                ).all()
            assert sorted(stored_rewards.values()) == [-1.0, -1.0, 1.0, 1.0], stored_rewards
            assert set(stored) == set(rated)

        # 3. SIGKILL of one engine under concurrent calls to both gateways
        load = Load(gw_urls, key, CLIENTS)
        load.start()
        load.wait(lambda: load.acked() >= BEFORE_KILL, 120)
        victim, survivor = engines
        survivor_url = stack.engine_urls[1]
        t_kill = time.monotonic()
        sigkill(victim)
        load.wait(lambda: load.done_after(t_kill) >= AFTER_KILL, 120)
        load.stop()
        after = [x for x in load.calls if x["start"] > t_kill]
        in_flight = [x for x in load.calls if x["start"] <= t_kill < x["end"]]
        assert len(after) >= AFTER_KILL
        assert all(x["status"] == 200 for x in after), [x["status"] for x in after]
        acked = {x["id"] for x in load.calls if x["status"] == 200}
        found = {r.id: r for r in wait_rows(factory, acked, timeout=60)}
        lost = acked - set(found)
        assert not lost, sorted(lost)[:5]
        with factory() as db:
            served_by = set(
                db.scalars(
                    select(InteractionRow.engine_url).where(
                        InteractionRow.id.in_([x["id"] for x in after])
                    )
                )
            )
        assert served_by == {survivor_url}

        # 4. SIGKILL of the worker in the middle of a run; the other one takes over
        set_training(factory, pid, step_delay_s=30.0)
        producer = make_celery(settings)

        def send(run_id: str) -> None:  # to the workers' default queue, as `rlgate train` does
            producer.send_task("rlgate.train_project", args=[pid, "manual", run_id])

        run1 = runs.create_queued(factory, pid, "manual")
        send(run1)
        claimed = _wait_run(factory, run1, ("running", "failed", "published"), timeout=60)
        assert claimed.status == "running", claimed.error
        holder = int(str(claimed.config["worker"]).rpartition(":")[2])
        (dying,) = [w for w in workers if w.proc.pid == holder]
        (other,) = [w for w in workers if w is not dying]
        time.sleep(3)  # loading the model, or inside the delayed optimizer step
        t_wkill = time.monotonic()
        sigkill(dying)
        set_training(factory, pid, step_delay_s=0.0)
        run2 = runs.create_queued(factory, pid, "manual")
        send(run2)
        _wait_run(factory, run2, ("running", "published", "failed", "trained-not-published"))
        claimed_s = time.monotonic() - t_wkill
        run = _wait_run(factory, run2, ("published", "failed", "trained-not-published"))
        published_s = time.monotonic() - t_wkill
        assert run.status == "published", (run.error, other.log.read_text()[-3000:])
        with factory() as db:
            dead = db.get(TrainingRunRow, run1)
            assert dead.status == "failed" and "worker lost" in dead.error, dead.error
            consumed = db.scalars(
                select(InteractionRow.id).where(InteractionRow.consumed_by_run_id == run2)
            ).all()
            version = db.get(PolicyVersionRow, run.policy_version_id)
        assert int(str(run.config["worker"]).rpartition(":")[2]) == other.proc.pid
        assert set(consumed) == set(rated)
        assert version.status == "serving"
        models = httpx.get(f"{survivor_url}/v1/models", headers=auth, timeout=30).json()
        assert version.name in {m["id"] for m in models["data"][1:]}

        time.sleep(0.6)  # the gateways' serving-pointer cache
        with httpx.Client(timeout=120) as c:
            for g in gw_urls:
                body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
                r = chat(c, g, key, body)
                assert r.status_code == 200, r.text
                assert r.headers["x-rlgate-policy-version"] == version.name

        # 5. the killed engine restarts, without adapters: the gateways load the serving
        # one into it (gateway/engines/adapter_sync.py) and no call is served without it
        victim_url = stack.engine_urls[0]
        assert victim.proc.poll() is not None
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RLGATE_DATA_DIR": str(data),
            "RLGATE_ENGINE_API_KEY": engine_key,
        }
        with (stack.logs / "engine1-restarted.log").open("ab") as fh:
            restarted = subprocess.Popen(
                victim.proc.args, env=env, stdout=fh, stderr=subprocess.STDOUT
            )
        wait_up(victim_url, restarted)
        t_back = time.monotonic()
        back_ids, loaded_s = [], None
        with httpx.Client(timeout=120) as c:
            for i in range(RESTART_CALLS):
                body = {"messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4}
                r = chat(c, gw_urls[i % 2], key, body, sid=f"back-{i}")
                assert r.status_code == 200, r.text
                assert r.headers["x-rlgate-policy-version"] == version.name
                back_ids.append(r.json()["id"])
                if loaded_s is None and version.name in engine_adapters(victim_url, auth):
                    loaded_s = time.monotonic() - t_back
                time.sleep(0.5)
        assert loaded_s is not None, "the restarted engine never got the serving adapter"
        # loaded by a gateway's adapter sync (gateway/engines/adapter_sync.py), not the
        # trainer's tick
        loads = f"loaded serving adapter {version.name} into {victim_url}"
        gateway_logs = [
            by_name[g].log.read_text(errors="replace") for g in ("gateway1", "gateway2")
        ]
        assert any(loads in text for text in gateway_logs), loads
        with factory() as db:
            back = db.execute(
                select(InteractionRow.engine_url, InteractionRow.policy_version).where(
                    InteractionRow.id.in_(back_ids)
                )
            ).all()
        assert {pv for _, pv in back} == {version.name}
        on_restarted = sum(url == victim_url for url, _ in back)
        assert on_restarted > 0, back  # it serves again, with the adapter
    finally:
        if restarted is not None and restarted.poll() is None:
            restarted.terminate()
            restarted.wait(timeout=30)
        stack.stop()

    total_s = time.monotonic() - t0
    statuses = sorted({x["status"] for x in in_flight})
    print(
        f"\nmulti-process: 2 engines, 2 gateways, 2 workers up in {started_s:.1f} s\n"
        f"  affinity: turn 2 via the other gateway on the same engine, "
        f"{cached} of {second.usage['prompt_tokens']} prompt tokens from its cache\n"
        f"  feedback: {len(rated)} ratings via gateway B for gateway A's answers, stored\n"
        f"  engine SIGKILL: {len(load.calls)} calls ({CLIENTS} clients, both gateways), "
        f"{len(acked)} acknowledged, {len(lost)} lost; {len(in_flight)} in flight at the kill "
        f"(statuses {statuses}); {len(after)} started after it, "
        f"{sum(x['status'] == 200 for x in after)} succeeded, all on the surviving engine\n"
        f"  worker SIGKILL mid-run: the other worker claimed the next run "
        f"{claimed_s:.1f} s after the kill and published {version.name} "
        f"{published_s:.1f} s after it (dead run failed: worker lost; same "
        f"{len(consumed)} samples); adapter loaded in the surviving engine\n"
        f"  engine restart: the gateways loaded {version.name} into it within "
        f"{loaded_s:.1f} s of it answering; {RESTART_CALLS} calls all 200 on {version.name}, "
        f"{on_restarted} of them served by the restarted engine\n"
        f"  whole test: {total_s:.1f} s"
    )
