"""POST /feedback, GET /v1/feedback, GET /v1/sessions/{id} and the AReaL-compatible
/rl/* routes. The rated calls need no real model: the routes run on ``fake_stack``, the
unit tier (the gateway app in-process on SQLite in front of the fake engine,
tests/gateway/fake_engine.py). Listing with its cursor and ``since`` pages on stored
timestamps, which each database keeps its own way: it runs on a real gateway and engine
on SQLite and PostgreSQL (``stack``)."""

from __future__ import annotations

import functools
import secrets

import httpx
import pytest
from sqlalchemy import func, select

from schemas.tables import ApiKeyRow, FeedbackRow, InteractionRow, SessionRow

_post = functools.partial(httpx.post, timeout=60)
_get = functools.partial(httpx.get, timeout=60)


def _h(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def _chat(stack, key, content="Say hi.", path="/v1/chat/completions", **extra):  # type: ignore[no-untyped-def]
    headers = _h(key, **extra.pop("headers", {}))
    r = _post(
        stack.gw.url + path,
        headers=headers,
        json={
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 2,
            "temperature": 0,
            **extra,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["id"], r.headers["x-rlgate-session-id"]


def _fb(stack, key, **body):  # type: ignore[no-untyped-def]
    return _post(stack.gw.url + "/feedback", headers=_h(key), json=body, timeout=30)


def _project() -> str:
    return "fb_" + secrets.token_hex(4)


def _feedback_count(stack, **where) -> int:  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        q = select(func.count()).select_from(FeedbackRow)
        for k, v in where.items():
            q = q.where(getattr(FeedbackRow, k) == v)
        return db.scalar(q)


def _reward(stack, iid):  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        return db.scalar(select(InteractionRow.reward).where(InteractionRow.id == iid))


def test_interaction_feedback_every_scale_and_key_kind(fake_stack):
    project = _project()
    agent = fake_stack.key("agent", project)
    iid, sid = _chat(fake_stack, agent)
    # sent right after the response: the recorder may not have committed the row yet
    r = _fb(fake_stack, agent, interaction_id=iid, value=4, scale="stars-5", comment="good")
    assert r.status_code == 200, r.text
    fb = r.json()
    assert fb["object"] == "feedback"
    assert (fb["target_type"], fb["target_id"], fb["session_id"]) == ("interaction", iid, sid)
    assert (fb["reward"], fb["value"], fb["source"], fb["comment"]) == (0.5, 4.0, "user", "good")
    assert fb["project_id"] == project
    r = _fb(
        fake_stack,
        fake_stack.key("feedback", project),
        interaction_id=iid,
        value="thumbs_up",
        scale="thumbs",
    )
    assert r.status_code == 200, r.text
    assert (r.json()["reward"], r.json()["value"], r.json()["scale"]) == (1.0, True, "binary")
    r = _fb(
        fake_stack,
        fake_stack.key("admin", project),
        interaction_id=iid,
        value=7,
        scale="scalar",
        min=0,
        max=10,
        rater="ops",
    )
    assert r.status_code == 200, r.text
    assert r.json()["reward"] == pytest.approx(0.4)
    assert (r.json()["scale_min"], r.json()["scale_max"]) == (0, 10)
    # three raters -> the mean, written by the route's credit assignment
    assert _reward(fake_stack, iid) == pytest.approx((0.5 + 1.0 + 0.4) / 3)

    bad = _fb(fake_stack, agent, interaction_id=iid, value=6, scale="stars-5")
    assert bad.status_code == 400  # out of range: a 400 like every bad body (issue 38)
    assert bad.json()["error"]["param"] == "value"
    assert "1 to 5" in bad.json()["error"]["message"]
    thumbs = _fb(fake_stack, agent, interaction_id=iid, value=5, scale="binary")
    assert thumbs.status_code == 400 and thumbs.json()["error"]["param"] == "value"
    assert "out of range" in thumbs.json()["error"]["message"]
    assert _fb(fake_stack, agent, interaction_id=iid, value=1, scale="percent").status_code == 400
    missing = _fb(fake_stack, agent, interaction_id="chatcmpl-nope", value=True)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    assert _feedback_count(fake_stack, project_id=project) == 3


def test_group_feedback_rewards_every_member(fake_stack):
    project = _project()
    agent = fake_stack.key("agent", project)
    gid, _ = _chat(fake_stack, agent, n=2, temperature=1.0)
    r = _fb(fake_stack, agent, interaction_id=gid, value=True)
    assert r.status_code == 200, r.text
    assert (r.json()["target_type"], r.json()["target_id"]) == ("group", gid)
    assert _reward(fake_stack, f"{gid}.0") == _reward(fake_stack, f"{gid}.1") == 1.0
    r = _fb(fake_stack, agent, interaction_id=f"{gid}.1", value="down")
    assert r.json()["target_type"] == "interaction"
    assert (_reward(fake_stack, f"{gid}.0"), _reward(fake_stack, f"{gid}.1")) == (1.0, -1.0)


def test_latest_picks_the_right_session_and_session_view(fake_stack):
    project = _project()
    agent = fake_stack.key("agent", project)
    a1, sa = _chat(fake_stack, agent, "Name a fruit.", headers={"X-Session-Id": "task-a"})
    b1, sb = _chat(fake_stack, agent, "Name a planet.", headers={"X-Session-Id": "task-b"})
    a2, sa2 = _chat(fake_stack, agent, "Another fruit?", headers={"X-Session-Id": "task-a"})
    assert sa == sa2 != sb
    r = _fb(fake_stack, agent, session="latest", value=5, scale="stars-5")
    assert r.status_code == 200, r.text
    assert (r.json()["target_type"], r.json()["target_id"]) == ("session", sa)
    # a session rating rewards the last turn; gamma defaults to 1.0
    assert _reward(fake_stack, a1) == _reward(fake_stack, a2) == 1.0
    assert _reward(fake_stack, b1) is None  # unrated: skip
    r = _fb(fake_stack, agent, session_id=sb, value=0.25)
    assert (r.json()["target_id"], r.json()["reward"]) == (sb, -0.5)

    view = _get(f"{fake_stack.gw.url}/v1/sessions/{sa}", headers=_h(agent)).json()
    assert view["id"] == sa and view["object"] == "session"
    assert [(i["id"], i["reward"]) for i in view["interactions"]] == [(a1, 1.0), (a2, 1.0)]
    assert [f["reward"] for f in view["feedback"]] == [1.0]
    other = fake_stack.key("agent", _project())
    assert _get(f"{fake_stack.gw.url}/v1/sessions/{sa}", headers=_h(other)).status_code == 404
    fbkey = fake_stack.key("feedback", project)
    assert _get(f"{fake_stack.gw.url}/v1/sessions/{sa}", headers=_h(fbkey)).status_code == 403
    # a key that has made no call has no latest session
    assert (
        _fb(fake_stack, fake_stack.key("agent", project), session="latest", value=1).status_code
        == 404
    )


def test_cross_project_feedback_is_404_and_stores_nothing(fake_stack):
    project = _project()
    agent = fake_stack.key("agent", project)
    iid, sid = _chat(fake_stack, agent)
    _fb(fake_stack, agent, interaction_id=iid, value=True)  # committed now
    before = _feedback_count(fake_stack)
    for key in (
        fake_stack.key("agent", "intruder"),
        fake_stack.key("feedback", "intruder"),
        fake_stack.key("admin", "intruder"),
    ):
        for body in ({"interaction_id": iid}, {"session_id": sid}):
            r = _fb(fake_stack, key, value=True, **body)
            assert r.status_code == 404, r.text
            ref = body.get("interaction_id") or body.get("session_id")
            assert r.json()["error"]["message"] in (f"no interaction {ref}", f"no session {ref}")
    assert _feedback_count(fake_stack) == before
    # the same answer as for an id that does not exist at all
    r = _fb(
        fake_stack, fake_stack.key("agent", "intruder"), session_id="sess_doesnotexist", value=True
    )
    assert r.json()["error"]["message"] == "no session sess_doesnotexist"


def test_idempotency_same_body_same_record_different_body_409(fake_stack):
    project = _project()
    agent = fake_stack.key("agent", project)
    _, sid = _chat(fake_stack, agent)
    body = {"session_id": sid, "value": 1, "scale": "binary", "idempotency_key": "rate-1"}
    first = _fb(fake_stack, agent, **body)
    assert first.status_code == 200, first.text
    again = _fb(fake_stack, agent, **dict(reversed(body.items())))
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("idempotent-replayed") == "true"
    conflict = _fb(fake_stack, agent, **{**body, "value": 0})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["type"] == "conflict_error"
    assert _feedback_count(fake_stack, project_id=project) == 1


def test_list_feedback_admin_filters_and_paging(stack):
    project = _project()
    agent = stack.key("agent", project)
    iid, sid = _chat(stack, agent)
    for i in range(4):
        r = _fb(stack, agent, interaction_id=iid, value=i + 1, scale="stars-5", rater=f"r{i}")
        assert r.status_code == 200, r.text
    # the fifth is the judge's: written by the worker (no client names a system source)
    from core.feedback import FeedbackInput, Scope, store_feedback

    judged = FeedbackInput("interaction", iid, 5.0, "stars-5", None, None, 1.0, "judge", "r4")
    store_feedback(stack.factory, judged, Scope(project), wait_s=0)
    admin = stack.key("admin", project)
    url = stack.gw.url + "/v1/feedback"
    assert _get(url, headers=_h(agent)).status_code == 403
    page = _get(url, headers=_h(admin), params={"limit": 2}).json()
    assert [f["rater"] for f in page["data"]] == ["r0", "r1"] and page["has_more"]
    seen = [f["rater"] for f in page["data"]]
    while page["has_more"]:
        page = _get(
            url, headers=_h(admin), params={"limit": 2, "cursor": page["next_cursor"]}
        ).json()
        seen += [f["rater"] for f in page["data"]]
    assert seen == ["r0", "r1", "r2", "r3", "r4"]
    off = _get(url, headers=_h(admin), params={"limit": 2, "offset": 3}).json()
    assert [f["rater"] for f in off["data"]] == ["r3", "r4"]
    judge = _get(url, headers=_h(admin), params={"source": "judge"}).json()
    assert [f["rater"] for f in judge["data"]] == ["r4"]
    by = _get(url, headers=_h(admin), params={"session_id": sid, "interaction_id": iid})
    assert len(by.json()["data"]) == 5
    since = page["data"][-1]["created_at"]
    assert [
        f["rater"] for f in _get(url, headers=_h(admin), params={"since": since}).json()["data"]
    ] == ["r4"]
    other = _get(url, headers=_h(admin), params={"project": "someone-else"})
    assert other.status_code == 403
    assert _get(url, headers=_h(admin), params={"cursor": "!!"}).status_code == 400


def test_areal_flow_makes_the_same_records_as_the_native_api(fake_stack):
    project = _project()
    admin = fake_stack.key("admin", project)
    url = fake_stack.gw.url
    r = _post(url + "/rl/start_session", headers=_h(admin), json={"task_id": "demo-0"})
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"session_id", "api_key"}
    sid, skey = r.json()["session_id"], r.json()["api_key"]
    iid, got_sid = _chat(fake_stack, skey, path="/chat/completions")  # AReaL's base_url has no /v1
    assert got_sid == sid
    r = _post(url + "/rl/set_reward", headers=_h(skey), json={"reward": 1.0})
    assert r.status_code == 200, r.text
    assert r.json()["message"] == "success"
    r = _post(
        url + "/rl/set_reward", headers=_h(skey), json={"reward": -0.5, "interaction_id": iid}
    )
    assert r.status_code == 200, r.text
    bad = _post(
        url + "/rl/set_reward",
        headers=_h(skey),
        json={"reward": 1.0, "interaction_id": "chatcmpl-unknown"},
    )
    assert bad.status_code == 400
    end = _post(url + "/rl/end_session", headers=_h(skey), json={})
    assert end.status_code == 200, end.text
    assert end.json() == {"message": "success", "interaction_count": 1}
    assert _post(url + "/rl/end_session", headers=_h(skey), json={}).status_code == 410
    after = _post(
        url + "/chat/completions",
        headers=_h(skey),
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    )
    assert after.status_code == 403

    native = [
        {"session_id": sid, "value": 1.0},
        {"interaction_id": iid, "value": -0.5},
    ]
    for body in native:
        # a client rates as a user (only rlgate's own routes write system sources)
        r = _fb(fake_stack, skey, scale="scalar", min=-1, max=1, rater="areal", **body)
        assert r.status_code == 200, r.text
    with fake_stack.factory() as db:
        rows = db.scalars(
            select(FeedbackRow)
            .where(FeedbackRow.session_id == sid)
            .order_by(FeedbackRow.created_at)
        ).all()
        assert len(rows) == 4
        assert [r.source for r in rows] == ["system", "system", "user", "user"]
        skip = {"id", "created_at", "_sa_instance_state", "source", "request_hash"}
        areal_rows = [{k: v for k, v in vars(r).items() if k not in skip} for r in rows[:2]]
        native_rows = [{k: v for k, v in vars(r).items() if k not in skip} for r in rows[2:]]
        assert areal_rows == native_rows
        assert areal_rows[0]["target_type"] == "session"
        assert areal_rows[1]["target_type"] == "interaction"
        session = db.get(SessionRow, sid)
        assert (session.status, session.client_protocol, session.task_id) == (
            "closed",
            "areal",
            "demo-0",
        )
    assert _reward(fake_stack, iid) == -0.5  # the interaction rating wins over the session's


def test_areal_refresh_reuses_the_key_for_a_new_session(fake_stack):
    project = _project()
    admin = fake_stack.key("admin", project)
    url = fake_stack.gw.url + "/rl/start_session"
    mine = "sk-sess-" + secrets.token_hex(16)  # caller-chosen keys: 32 characters or more
    first = _post(url, headers=_h(admin), json={"task_id": "t", "api_key": mine}).json()
    assert first["api_key"] == mine
    second = _post(url, headers=_h(admin), json={"task_id": "t", "api_key": mine}).json()
    assert second["api_key"] == mine and second["session_id"] != first["session_id"]
    with fake_stack.factory() as db:
        assert db.get(SessionRow, first["session_id"]).status == "closed"
        assert db.get(SessionRow, second["session_id"]).status == "open"
        key = db.scalars(select(ApiKeyRow).where(ApiKeyRow.session_id == second["session_id"]))
        assert key.one().prefix == mine[:8]  # a key list shows 8 characters at most
    # no interaction yet: AReaL answers 400
    r = _post(fake_stack.gw.url + "/rl/set_reward", headers=_h(mine), json={"reward": 1})
    assert r.status_code == 400
    # a session key cannot start sessions; a key of another project cannot be reused
    assert _post(url, headers=_h(mine), json={"task_id": "t"}).status_code == 403
    other_admin = fake_stack.key("admin", _project())
    r = _post(url, headers=_h(other_admin), json={"task_id": "t", "api_key": mine})
    assert r.status_code == 409
