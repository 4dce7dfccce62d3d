"""Bad input: 4xx in OpenAI's error shape, and nothing recorded.

Unit tier: every refusal here happens before an engine is asked, on any database, so the
module runs on ``fake_stack`` (the gateway app in-process on SQLite, a fake engine). A
request the gateway wrongly let through would reach the fake engine, get its answer and
be recorded: the status and "nothing recorded" checks still fail then."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.helpers import counts

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def stack(fake_stack):  # type: ignore[no-untyped-def]
    return fake_stack


OK_MSG = [{"role": "user", "content": "hi"}]
CASES = [
    ({"model": "x"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": "hello"}, "messages"),
    ({"messages": OK_MSG, "temperature": "hot"}, "temperature"),
    ({"messages": OK_MSG, "temperature": 3}, "temperature"),
    ({"messages": OK_MSG, "n": 0}, "n"),
    ({"messages": OK_MSG, "max_tokens": -5}, "max_tokens"),
    (
        {"messages": OK_MSG, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        "name",
    ),
    (
        {
            "messages": OK_MSG,
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
            ],
        },
        "JSON Schema",
    ),
    (
        {"messages": OK_MSG, "response_format": {"type": "json_schema", "json_schema": {}}},
        "response_format",
    ),
    ({"messages": OK_MSG, "frobnicate": True}, "frobnicate"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ]
        },
        "text only",
    ),
    ({"messages": [{"role": "tool", "content": "4"}]}, "tool_call_id"),
    ({"messages": [{"role": "user", "content": "word " * 3000}]}, "context"),
    ({"messages": OK_MSG, "max_tokens": 100000}, "maximum context length"),
]


@pytest.mark.parametrize("body,needle", CASES, ids=[c[1] for c in CASES])
def test_bad_request_is_400_and_records_nothing(stack, body, needle):
    key = stack.key()
    before = counts(stack)
    r = httpx.post(
        stack.gw.url + "/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert needle in err["message"] or needle == err.get("param")
    assert counts(stack) == before


def test_invalid_json_body(stack):
    r = httpx.post(
        stack.gw.url + "/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {stack.key()}"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Bearer rlg_agent_wrong"])
def test_unknown_key_is_401(stack, auth):
    headers = {"Authorization": auth} if auth else {}
    before = counts(stack)
    r = httpx.post(
        stack.gw.url + "/v1/chat/completions", json={"messages": OK_MSG}, headers=headers
    )
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert counts(stack) == before


def test_revoked_key_stops_working(stack):
    from core.db import transaction
    from core.keys import create_key, revoke_key

    with transaction(stack.factory) as db:
        row, secret = create_key(db, "p1", "agent")
    h = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(stack.gw.url + "/v1/models", headers=h).status_code == 200
    with transaction(stack.factory) as db:
        revoke_key(db, row.id)
    import time

    time.sleep(2.1)  # the gateway's key cache lives 2 s
    assert httpx.get(stack.gw.url + "/v1/models", headers=h).status_code == 401


def test_feedback_key_cannot_call_models(stack):
    r = httpx.post(
        stack.gw.url + "/v1/chat/completions",
        json={"messages": OK_MSG},
        headers={"Authorization": f"Bearer {stack.key('feedback')}"},
    )
    assert r.status_code == 403


def test_sglang_admin_endpoints_are_not_exposed(stack):
    h = {"Authorization": f"Bearer {stack.key('admin')}"}
    for path in (
        "/load_lora_adapter",
        "/unload_lora_adapter",
        "/update_weights_from_disk",
        "/generate",
    ):
        assert httpx.post(stack.gw.url + path, json={}, headers=h).status_code == 404
