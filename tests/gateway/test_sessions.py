"""Sessions three ways: per-session key, fixed key + X-Session-Id, fixed key stitching.

On each database, with the gateway in-process in front of a fake engine
(``fake_db_stack``): what groups calls into sessions is the gateway's and the database's,
not the model's tokens."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.helpers import wait_recorded


@pytest.fixture(scope="module")
def stack(fake_db_stack):  # type: ignore[no-untyped-def]
    return fake_db_stack


def _turn(client, messages, **extra):  # type: ignore[no-untyped-def]
    raw = client.chat.completions.with_raw_response.create(
        model="rlgate-policy", messages=messages, temperature=0, max_tokens=8, **extra
    )
    resp = raw.parse()
    return resp, raw.headers


def _conversation(client, opener: str, turns: int = 3, **extra):  # type: ignore[no-untyped-def]
    """A multi-turn chat where each request resends the history plus the answer."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": opener},
    ]
    out = []
    for i in range(turns):
        resp, headers = _turn(client, messages, **extra)
        out.append((resp, headers))
        messages = messages + [
            {"role": "assistant", "content": resp.choices[0].message.content},
            {"role": "user", "content": f"And then? ({i})"},
        ]
    return out


def test_fixed_key_stitches_one_conversation_with_parent_links(stack):
    client = stack.client()
    turns = _conversation(client, "Name a color.")
    sessions = {h["x-rlgate-session-id"] for _, h in turns}
    assert len(sessions) == 1
    recs = wait_recorded(stack, [r.id for r, _ in turns])
    assert [r.seq for r in recs] == [0, 1, 2]
    assert recs[0].parent_id is None
    assert recs[1].parent_id == recs[0].id
    assert recs[2].parent_id == recs[1].id


def test_two_interleaved_conversations_on_one_key_are_two_sessions(stack):
    client = stack.client()
    a = [{"role": "user", "content": "Name a fruit."}]
    b = [{"role": "user", "content": "Name a planet."}]
    ids = {"a": [], "b": []}
    for i in range(2):
        for name, msgs in (("a", a), ("b", b)):
            resp, headers = _turn(client, msgs)
            ids[name].append((resp.id, headers["x-rlgate-session-id"]))
            msgs += [
                {"role": "assistant", "content": resp.choices[0].message.content},
                {"role": "user", "content": f"Another one ({i})."},
            ]
    sa = {s for _, s in ids["a"]}
    sb = {s for _, s in ids["b"]}
    assert len(sa) == 1 and len(sb) == 1 and sa != sb
    ra = wait_recorded(stack, [i for i, _ in ids["a"]])
    assert ra[1].parent_id == ra[0].id


def test_session_header_groups_unrelated_calls(stack):
    client = stack.client(default_headers={"X-Session-Id": "client-task-42"})
    r1, h1 = _turn(client, [{"role": "user", "content": "Hi."}])
    r2, h2 = _turn(client, [{"role": "user", "content": "A different question."}])
    assert h1["x-rlgate-session-id"] == h2["x-rlgate-session-id"]
    other = stack.client(default_headers={"X-Session-Id": "client-task-43"})
    _, h3 = _turn(other, [{"role": "user", "content": "Hi."}])
    assert h3["x-rlgate-session-id"] != h1["x-rlgate-session-id"]
    recs = wait_recorded(stack, [r1.id, r2.id])
    assert recs[0].session_id == recs[1].session_id
    from schemas.tables import SessionRow

    with stack.factory() as db:
        assert db.get(SessionRow, recs[0].session_id).external_id == "client-task-42"


def test_per_session_key_and_end(stack):
    key = stack.key()
    r = httpx.post(
        stack.gw.url + "/v1/sessions",
        headers={"Authorization": f"Bearer {key}"},
        json={"task_id": "t-1", "agent_name": "pytest"},
    )
    assert r.status_code == 201, r.text
    sid, session_key = r.json()["id"], r.json()["api_key"]
    client = stack.client(session_key)
    turns = [_turn(client, [{"role": "user", "content": q}]) for q in ("One?", "Two?")]
    assert {h["x-rlgate-session-id"] for _, h in turns} == {sid}
    end = httpx.post(
        f"{stack.gw.url}/v1/sessions/{sid}/end", headers={"Authorization": f"Bearer {session_key}"}
    )
    assert end.status_code == 200 and end.json()["status"] == "closed"
    after = httpx.post(
        stack.gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {session_key}"},
        json={"messages": [{"role": "user", "content": "Three?"}]},
    )
    assert after.status_code == 403
    assert "closed" in after.json()["error"]["message"]
