"""Who may read what (SQLite and PostgreSQL):
per-session keys see their own session's responses only, feedback keys no response
bodies, minted keys die with their parent, caller-chosen AReaL keys are long, and the
operational endpoints (/health details, /metrics, /openapi.json) need an admin key.

On each database, with the gateway in-process in front of a fake engine
(``fake_db_stack``): who may read what is the gateway's and the database's, not the
model's."""

from __future__ import annotations

import functools
import secrets
import time

import httpx
import pytest
from sqlalchemy import select

from core.db import transaction
from core.keys import revoke_key
from schemas.tables import ApiKeyRow
from tests.gateway.helpers import wait_recorded


@pytest.fixture(scope="module")
def stack(fake_db_stack):  # type: ignore[no-untyped-def]
    return fake_db_stack


_post = functools.partial(httpx.post, timeout=120)
_get = functools.partial(httpx.get, timeout=60)


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _project() -> str:
    return "scope_" + secrets.token_hex(4)


def _session_key(stack, parent: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    r = _post(stack.gw.url + "/v1/sessions", headers=_h(parent), json={})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


def _respond(stack, key: str, **extra: object) -> httpx.Response:  # type: ignore[no-untyped-def]
    body = {"model": "m", "input": "Say hi.", "max_output_tokens": 2, "temperature": 0, **extra}
    return _post(stack.gw.url + "/v1/responses", headers=_h(key), json=body)


def _until_status(url: str, key: str, status: int, limit_s: float = 20.0) -> int:
    """GET until it answers ``status`` (the auth cache forgets a key within 2 s)."""
    deadline = time.monotonic() + limit_s
    while True:
        got = _get(url, headers=_h(key)).status_code
        if got == status or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_session_key_reads_and_continues_only_its_own_session(stack):
    project = _project()
    agent = stack.key("agent", project)
    _, mine = _session_key(stack, agent)
    _, theirs = _session_key(stack, agent)
    r = _respond(stack, mine)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    wait_recorded(stack, [rid])
    url = f"{stack.gw.url}/v1/responses/{rid}"
    assert _get(url, headers=_h(mine)).status_code == 200
    assert _get(url, headers=_h(agent)).status_code == 200  # the project's agent key
    other = _get(url, headers=_h(theirs))
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"
    fb = _get(url, headers=_h(stack.key("feedback", project)))
    assert fb.status_code == 403 and "feedback" in fb.json()["error"]["message"]
    cont = _respond(stack, theirs, previous_response_id=rid)
    assert cont.status_code == 404 and cont.json()["error"]["param"] == "previous_response_id"
    assert _respond(stack, mine, previous_response_id=rid).status_code == 200


def test_minted_keys_stop_when_their_parent_is_revoked(stack):
    project = _project()
    agent = stack.key("agent", project)
    sid, child = _session_key(stack, agent)
    admin = stack.key("admin", project)
    r = _post(stack.gw.url + "/rl/start_session", headers=_h(admin), json={"task_id": "t"})
    assert r.status_code == 200, r.text
    areal_sid, areal_key = r.json()["session_id"], r.json()["api_key"]
    own = f"{stack.gw.url}/v1/sessions/{sid}"
    assert _get(own, headers=_h(child)).status_code == 200
    with stack.factory() as db:
        rows = db.scalars(select(ApiKeyRow).where(ApiKeyRow.session_id.in_([sid, areal_sid])))
        parents = {r.session_id: r.parent_key_id for r in rows}
        agent_row = db.scalars(select(ApiKeyRow).where(ApiKeyRow.id == parents[sid])).one()
    assert agent_row.kind == "agent" and agent_row.session_id is None
    assert parents[areal_sid] is not None
    with transaction(stack.factory) as db:
        revoke_key(db, agent_row.id, actor="test")
        revoke_key(db, parents[areal_sid], actor="test")
    assert _until_status(own, child, 401) == 401
    areal = f"{stack.gw.url}/rl/set_reward"
    deadline = time.monotonic() + 20
    while (s := _post(areal, headers=_h(areal_key), json={"reward": 1}).status_code) != 401:
        assert time.monotonic() < deadline, s
        time.sleep(0.2)


def test_caller_chosen_areal_keys_are_long_and_never_listed_whole(stack):
    project = _project()
    admin = stack.key("admin", project)
    url = stack.gw.url + "/rl/start_session"
    short = "sk-" + secrets.token_hex(14)  # 31 characters
    r = _post(url, headers=_h(admin), json={"api_key": short})
    assert r.status_code == 400 and "32" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "api_key"
    chosen = "sk-" + secrets.token_hex(15)[:29]  # 32 characters
    r = _post(url, headers=_h(admin), json={"api_key": chosen})
    assert r.status_code == 200, r.text
    with stack.factory() as db:
        row = db.scalars(
            select(ApiKeyRow).where(ApiKeyRow.session_id == r.json()["session_id"])
        ).one()
    assert row.prefix == chosen[:8] and len(row.prefix) <= len(chosen) // 4


def test_operational_endpoints_need_an_admin_key(stack):
    project = _project()
    admin, agent = stack.key("admin", project), stack.key("agent", project)
    url = stack.gw.url
    public = _get(url + "/health")
    assert public.status_code in (200, 503)
    assert set(public.json()) == {"status"}
    detailed = _get(url + "/health", headers=_h(admin))
    assert detailed.status_code == public.status_code
    assert "engines" in detailed.json() and "recording_pending" in detailed.json()
    assert set(_get(url + "/health", headers=_h(agent)).json()) == {"status"}
    for path in ("/metrics", "/openapi.json"):
        assert _get(url + path).status_code == 401, path
        assert _get(url + path, headers=_h(agent)).status_code == 403, path
        assert _get(url + path, headers=_h(admin)).status_code == 200, path
    assert "/feedback" in _get(url + "/openapi.json", headers=_h(admin)).json()["paths"]
    assert b"rlgate" in _get(url + "/metrics", headers=_h(admin)).content
