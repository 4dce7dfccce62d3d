"""Admin actions answer at once, and the base model is a version (issue 38, items 3 and 4).

The fast in-process tier (the real gateway, the trainer's switch it calls, SQLite, before
a fake engine that holds each request until the test releases it and lists every load
and unload it gets: tests/gateway/fake_engine.py):
- a rollback while a request on the serving version is in flight answers while that
  request is still held; new requests go to the rolled-back-to version; the replaced one
  is unloaded from the engine only once the request ended (the engine counts, at each
  unload, the requests naming it that had not finished: 0), and meanwhile the adapter
  sync rounds leave it loaded (leases); ``GET /admin/api/unloads`` shows what it waits for;
- a background unload waits at most ``RLGATE_UNLOAD_WAIT_S``, then unloads anyway with
  an audit note (``forced``, the requests still on it);
- rollback and promote to ``base`` through the admin API: no adapter serves (the engine
  gets requests without ``lora_path``), an audit row names the base model; a rollback
  with no target after the first version serves the base model; what must be refused is.
Assertions are on what reached the engine and in which state, not on wall-clock time
(the time a rollback took is printed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.live_adapters import make_live
from core.serving_version import BASE, BASE_TARGET_TYPE
from schemas.coltypes import utcnow
from schemas.tables import AuditEventRow, InteractionRow, PolicyVersionRow, ProjectRow
from tests.gateway.fake_engine import FastStack, fast_stack

pytestmark = pytest.mark.timeout(300)

V = {n: f"p1-policy-v{n}" for n in (1, 2, 3)}


@pytest.fixture(scope="module")
def fast(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastStack]:
    data_dir = tmp_path_factory.mktemp("rollback")
    with fast_stack(data_dir, model_dir, engine_sync_s=0.2) as stack:
        yield stack


@pytest.fixture(scope="module")
def db(fast: FastStack) -> Iterator[Any]:
    engine = make_engine(fast.app.state.gw.settings.effective_database_url)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def admin(fast: FastStack, db: Any) -> dict[str, str]:
    """v1 retired, v2 serving (loaded in the engine), v3 rejected; a p1 admin key."""
    adapters = fast.app.state.gw.settings.effective_adapter_dir
    with transaction(db) as s:
        if s.get(ProjectRow, "p1") is None:
            s.add(ProjectRow(id="p1", name="p1", created_at=utcnow()))
            s.flush()
        _, key = create_key(s, "p1", "admin")
        for v, status in ((1, "retired"), (2, "serving"), (3, "rejected")):
            stored = adapters / "p1" / V[v]
            stored.mkdir(parents=True, exist_ok=True)
            (stored / "adapter_config.json").write_text("{}")
            (stored / "adapter_model.safetensors").write_bytes(b"")
            s.add(
                PolicyVersionRow(
                    id=f"pv_{v}",
                    project_id="p1",
                    name=V[v],
                    version=v,
                    base_model="SmolLM2-135M-Instruct",
                    path=str(stored),
                    lora_config={"r": 8},
                    status=status,
                    created_at=utcnow(),
                )
            )
    fast.engine.adapters[V[2]] = str(make_live(adapters / "p1" / V[2]))
    fast.app.state.gw.pipeline.serving.invalidate()
    return {"Authorization": f"Bearer {key}"}


def _act(fast: FastStack, headers: dict[str, str], action: str, **body: Any) -> httpx.Response:
    body.setdefault("project_id", "p1")
    return httpx.post(
        f"{fast.url}/admin/api/actions/{action}", json=body, headers=headers, timeout=60
    )


def _chat(fast: FastStack) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    return fast.post("/v1/chat/completions", body)


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _events(db: Any, action: str) -> list[AuditEventRow]:
    with db() as s:
        return list(
            s.scalars(
                select(AuditEventRow)
                .where(AuditEventRow.action == action)
                .order_by(AuditEventRow.created_at)
            )
        )


def _unloads(fast: FastStack, headers: dict[str, str]) -> list[dict[str, Any]]:
    r = httpx.get(f"{fast.url}/admin/api/unloads", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def test_rollback_answers_while_a_request_is_in_flight(fast: FastStack, admin, db) -> None:  # type: ignore[no-untyped-def]
    engine = fast.engine
    start = len(engine.arrivals)
    engine.hold()
    with ThreadPoolExecutor(4) as pool:
        long = pool.submit(_chat, fast)  # a long request on v2, held by the engine
        assert engine.wait_arrivals(start + 1)[start]["lora_path"] == V[2]
        t0 = time.monotonic()
        r = _act(fast, admin, "rollback", target="1")
        took = time.monotonic() - t0
        print(f"rollback answered in {took:.3f} s with a request in flight")
        assert r.status_code == 200, r.text
        # answered while the request on v2 is still held by the engine
        assert not long.done() and engine.in_flight(V[2]) == 1
        out = r.json()
        assert out["name"] == V[1] and out["previous"] == V[2] and out["changed"]
        assert out["unload"]["name"] == V[2] and out["unload"]["in_flight"] == 1
        assert out["unload"]["state"] == "waiting"
        assert [(u["name"], u["in_flight"]) for u in _unloads(fast, admin)] == [(V[2], 1)]
        # new requests go to v1 at once
        after = pool.submit(_chat, fast)
        assert engine.wait_arrivals(start + 2)[start + 1]["lora_path"] == V[1]
        # the adapter sync rounds (every 0.2 s) see retired v2 loaded, and leave it: in use
        rounds = engine.listings
        _wait(lambda: engine.listings >= rounds + 3, "no adapter sync round ran")
        assert V[2] not in [n for n, _ in engine.unloads] and V[2] in engine.adapters
        assert not long.done()
        engine.open()  # the long request ends
        assert long.result().status_code == 200 and after.result().status_code == 200
    _wait(lambda: V[2] not in engine.adapters, "v2 was not unloaded after its request")
    _wait(lambda: not _unloads(fast, admin), "the unload still shows as pending")
    # every unload of v2 came when no request on it was left
    assert [busy for n, busy in engine.unloads if n == V[2]] and all(
        busy == 0 for n, busy in engine.unloads if n == V[2]
    ), engine.unloads
    ids = [long.result().json()["id"], after.result().json()["id"]]
    _wait(lambda: _recorded(db, ids) == {ids[0]: V[2], ids[1]: V[1]}, "recorded versions")
    rolled = _events(db, "adapter.rollback")[-1]
    assert rolled.target_id == "pv_1" and rolled.details["previous"] == V[2]
    _wait(lambda: bool(_events(db, "adapter.unload")), "no adapter.unload audit row")
    note = _events(db, "adapter.unload")[-1]
    assert note.target_id == "pv_2" and note.details["forced"] is False
    assert note.details["failed"] == []


def _recorded(db: Any, ids: list[str]) -> dict[str, str]:
    with db() as s:
        rows = s.execute(
            select(InteractionRow.id, InteractionRow.policy_version).where(
                InteractionRow.id.in_(ids)
            )
        ).all()
    return dict(rows)


def test_base_model_by_api_and_a_bounded_wait(fast: FastStack, admin, db) -> None:  # type: ignore[no-untyped-def]
    """v1 serves (the test above). Rolling back to ``base`` while a request on v1 is held,
    with a wait bound of 0.3 s: the switch answers at once, v1 is unloaded anyway after
    the bound (audited: forced, 1 request still on it), and the held request still ends."""
    engine, unloads = fast.engine, fast.app.state.gw.unloads
    unloads.wait_s = 0.3
    start = len(engine.arrivals)
    engine.hold()
    try:
        with ThreadPoolExecutor(2) as pool:
            long = pool.submit(_chat, fast)
            assert engine.wait_arrivals(start + 1)[start]["lora_path"] == V[1]
            r = _act(fast, admin, "rollback", target="base")
            assert r.status_code == 200, r.text
            assert r.json()["name"] == BASE and r.json()["previous"] == V[1]
            _wait(lambda: V[1] not in engine.adapters, "v1 was not unloaded after the bound")
            assert (V[1], 1) in engine.unloads and not long.done()  # forced: 1 still on it
            base = pool.submit(_chat, fast)  # the base model: no adapter named
            assert engine.wait_arrivals(start + 2)[start + 1].get("lora_path") is None
            engine.open()
            assert long.result().status_code == 200 and base.result().status_code == 200
    finally:
        unloads.wait_s = 600.0
        engine.open()
    _wait(lambda: any(e.details["forced"] for e in _events(db, "adapter.unload")), "no note")
    forced = [e for e in _events(db, "adapter.unload") if e.details["forced"]][-1]
    assert forced.target_id == "pv_1" and forced.details["in_flight"] == 1
    to_base = _events(db, "adapter.rollback")[-1]
    assert (to_base.target_type, to_base.target_id) == (BASE_TARGET_TYPE, BASE)
    assert to_base.details["name"] == BASE and to_base.details["previous"] == V[1]
    with db() as s:
        statuses = dict(s.execute(select(PolicyVersionRow.name, PolicyVersionRow.status)).all())
    assert statuses == {V[1]: "retired", V[2]: "retired", V[3]: "rejected"}
    # nothing serves now: a rollback with no target has nothing to go back from
    again = _act(fast, admin, "rollback")
    assert again.status_code == 409 and "already serves the base model" in again.text
    same = _act(fast, admin, "promote", target="BASE")
    assert same.status_code == 200 and same.json() == {
        "name": BASE,
        "previous": None,
        "changed": False,
    }


def test_promote_from_base_and_the_default_rollback_to_it(fast: FastStack, admin, db) -> None:  # type: ignore[no-untyped-def]
    """From the base model, promote v2 (its audit says ``previous: base``); a rollback with
    no target then serves the base model again, as the version v2 replaced."""
    r = _act(fast, admin, "promote", target=V[2])
    assert r.status_code == 200 and r.json()["previous"] is None, r.text
    promoted = _events(db, "adapter.promote")[-1]
    assert promoted.target_id == "pv_2" and promoted.details["previous"] == BASE
    assert fast.engine.adapters.get(V[2])  # loaded for it
    back = _act(fast, admin, "rollback")
    assert back.status_code == 200, back.text
    assert back.json()["name"] == BASE and back.json()["previous"] == V[2]
    assert back.json()["unload"]["name"] == V[2]
    _wait(lambda: V[2] not in fast.engine.adapters, "v2 was not unloaded")


def test_a_version_served_again_before_its_unload_is_kept(fast: FastStack, admin, db) -> None:  # type: ignore[no-untyped-def]
    """v1 is promoted, a request on it is held, a rollback to the base model starts v1's
    background unload; v1 is promoted again before that request ends: when it ends, v1
    is kept (it serves), and no unload reaches the engine."""
    engine = fast.engine
    assert _act(fast, admin, "promote", target=V[1]).status_code == 200
    start, unloads_before = len(engine.arrivals), len(engine.unloads)
    engine.hold()
    try:
        with ThreadPoolExecutor(1) as pool:
            long = pool.submit(_chat, fast)
            assert engine.wait_arrivals(start + 1)[start]["lora_path"] == V[1]
            away = _act(fast, admin, "rollback", target="base")
            assert away.status_code == 200 and away.json()["unload"]["name"] == V[1]
            back = _act(fast, admin, "promote", target=V[1])
            assert back.status_code == 200 and back.json()["name"] == V[1], back.text
            engine.open()
            assert long.result().status_code == 200
    finally:
        engine.open()
    _wait(lambda: not _unloads(fast, admin), "the unload of v1 still shows as pending")
    rounds = engine.listings
    _wait(lambda: engine.listings >= rounds + 3, "no adapter sync round ran")
    assert V[1] in engine.adapters and len(engine.unloads) == unloads_before
    assert _act(fast, admin, "rollback", target="base").status_code == 200  # as before


@pytest.mark.parametrize(
    "action,body,status,says",
    [
        ("retire", {"target": "base"}, 409, "the base model cannot be retired"),
        ("promote", {"target": V[3]}, 409, "rejected by the eval gate"),
        ("rollback", {"target": "3"}, 409, "rejected by the eval gate"),
        ("promote", {"target": "p1-policy-v9"}, 404, "'base' for the base model"),
        ("promote", {"target": "base", "project_id": "p2"}, 404, "no project 'p2'"),
    ],
)
def test_what_is_refused(fast: FastStack, admin, db, action, body, status, says) -> None:  # type: ignore[no-untyped-def]
    before = len(_events(db, f"adapter.{action}"))
    r = _act(fast, admin, action, **body)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    assert len(_events(db, f"adapter.{action}")) == before  # nothing audited, nothing done


def test_an_agent_key_cannot_switch(fast: FastStack, admin) -> None:  # type: ignore[no-untyped-def]
    agent = {"Authorization": f"Bearer {fast.keys['p1']}"}
    r = _act(fast, agent, "rollback", target="base")
    assert r.status_code in (401, 403), r.text
