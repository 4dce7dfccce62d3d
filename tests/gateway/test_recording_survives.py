"""A gateway process keeps recording when the database refuses a record, and refuses up
front (400, in the client's own error format) what it could not store.

The attack from issue #14: on PostgreSQL an ``X-Session-Id`` over the 200-character column
or a ``\\u0000`` anywhere in a request made the recorder retry one record forever: later
calls were never stored (their feedback 404), /health said ok, and the gateway could not
restart until the spool segment was removed by hand. Real gateway, engine (packaged
model) and database; a refused record is forced past validation by leaving it in a spool
segment, as a gateway that died would.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key, ensure_project
from core.migrate import upgrade
from tests.gateway.helpers import counts, wait_recorded
from tests.gateway.records import entry, iid
from tests.servers import gateway

MSG = [{"role": "user", "content": "Say hi."}]


def _segment(spool: Path, entries: list[dict]) -> Path:
    spool.mkdir(parents=True, exist_ok=True)
    path = spool / f"segment-{time.time_ns()}-999999.jsonl"
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in entries))
    return path


def _poison(db_url: str) -> list[dict]:
    """Records the database refuses: a project that does not exist (both backends), and
    on PostgreSQL the issue's two triggers."""
    bad = [entry(project="no-such-project")]
    if db_url.startswith("postgresql"):
        bad += [entry(external_id="s" * 300), entry(content="a \x00 b")]
    return bad


def _chat(url: str, key: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "m", "max_tokens": 4, **body},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=120,
    )


def test_poisoned_spool_restart_dead_letters_health_and_later_calls(db_url, engine, tmp_path):
    upgrade(db_url)
    db_engine = make_engine(db_url)
    factory = session_factory(db_engine)
    with transaction(factory) as db:
        ensure_project(db, "p1")
        _, key = create_key(db, "p1", "agent")
        _, admin = create_key(db, "p1", "admin")
    data_dir = tmp_path / "gw"
    good, bad = entry(), _poison(db_url)
    # what a gateway that died left behind: a good record among refused ones
    first = _segment(data_dir / "spool", [bad[0], good, *bad[1:]])
    try:
        # the restart succeeds (it used to exit 3 until the segment was removed by hand)
        with gateway(data_dir, db_url, engine.url, spool_replay_interval_s="0.3") as gw:
            stack = type("S", (), {"factory": factory})()
            wait_recorded(stack, [iid(good)])
            assert not first.exists()
            dead = (data_dir / "dead_letters.jsonl").read_text().splitlines()
            assert [json.loads(x)["record"] for x in dead] == bad
            admin_h = {"Authorization": f"Bearer {admin}"}
            health = httpx.get(gw.url + "/health", headers=admin_h).json()
            assert health["status"] == "degraded"
            assert health["dead_letters"] == len(bad)
            assert any("refused by the database" in r for r in health["reasons"])
            assert httpx.get(gw.url + "/health").json() == {"status": "degraded"}

            # the attack itself is refused up front, in the client's own format
            before = counts(stack)
            r = _chat(gw.url, key, {"messages": MSG}, **{"X-Session-Id": "s" * 300})
            assert r.status_code == 400, r.text
            assert "300 characters" in r.json()["error"]["message"]
            r = _chat(gw.url, key, {"messages": [{"role": "user", "content": "a\u0000b"}]})
            assert r.status_code == 400, r.text
            assert "NUL" in r.json()["error"]["message"]
            r = httpx.post(
                gw.url + "/v1/messages",
                json={"model": "m", "max_tokens": 4, "messages": MSG},
                headers={"x-api-key": key, "x-session-id": "s" * 300},
                timeout=60,
            )
            assert r.status_code == 400 and r.json()["type"] == "error", r.text
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert counts(stack) == before

            # a segment a replica leaves while this gateway runs: replayed periodically
            later_good = entry()
            _segment(data_dir / "spool", [*_poison(db_url), later_good])
            wait_recorded(stack, [iid(later_good)])
            metrics = httpx.get(gw.url + "/metrics", headers=admin_h).text
            deadline = time.monotonic() + 20
            while f"rlgate_dead_letters_total {2.0 * len(bad)}" not in metrics:
                assert time.monotonic() < deadline, metrics
                time.sleep(0.1)
                metrics = httpx.get(gw.url + "/metrics", headers=admin_h).text

            # normal calls after the refused records are stored, and their feedback works
            r = _chat(gw.url, key, {"messages": MSG}, **{"X-Session-Id": "ok-session"})
            assert r.status_code == 200, r.text
            call_id = r.json()["id"]
            wait_recorded(stack, [call_id])
            fb = httpx.post(
                gw.url + "/feedback",
                json={"interaction_id": call_id, "value": 1, "comment": "fine"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert fb.status_code == 200, fb.text
            # the dashboard shows the count
            ov = httpx.get(gw.url + "/admin/api/overview", headers=admin_h, timeout=30).json()
            assert ov["recording"]["dead_letters"] == 2 * len(bad)
    finally:
        db_engine.dispose()


GENERATE = {
    "/v1/chat/completions": {"model": "m", "max_tokens": 4},
    "/v1/responses": {"model": "m", "max_output_tokens": 4},
}
DEEP = {"a": json.loads("[" * 200 + "]" * 200)}


@pytest.mark.parametrize(
    ("path", "body", "headers", "needle"),
    [
        ("/v1/chat/completions", {"messages": MSG}, {"X-Session-Id": "s" * 300}, "300 char"),
        ("/v1/chat/completions", {"messages": MSG, "metadata": {"agent_name": 5}}, {}, "string"),
        ("/v1/chat/completions", {"messages": MSG, "metadata": DEEP}, {}, "nested"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\x00"}]}, {}, "NUL"),
        ("/v1/responses", {"input": "hi\x00"}, {}, "NUL"),
        ("/v1/responses", {"input": "hi"}, {"session-id": "c" * 201}, "201 char"),
        ("/v1/sessions", {"task_id": 12}, {}, "'task_id' must be a string"),
        ("/v1/sessions", {"external_id": "e" * 201}, {}, "201 characters"),
        ("/rl/start_session", {"task_id": "t" * 201}, {}, "201 characters"),
    ],
)
def test_unstorable_openai_requests_are_400(stack, path, body, headers, needle):
    key = stack.key("admin") if path == "/rl/start_session" else stack.key()
    before = counts(stack)
    r = httpx.post(
        stack.gw.url + path,
        json={**GENERATE.get(path, {}), **body},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"], err
    assert counts(stack) == before


def test_deep_json_body_is_400_not_500(stack):
    raw = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(
        stack.gw.url + "/v1/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {stack.key()}", "content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert "nested more than" in r.json()["error"]["message"]


def test_unstorable_anthropic_request_is_400_in_anthropic_format(stack):
    r = httpx.post(
        stack.gw.url + "/v1/messages",
        json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "\x00"}]},
        headers={"x-api-key": stack.key(), "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "NUL" in body["error"]["message"]


def test_nul_in_feedback_comment_is_400(stack):
    r = httpx.post(
        stack.gw.url + "/feedback",
        json={"session": "latest", "value": 1, "comment": "bad \x00 comment"},
        headers={"Authorization": f"Bearer {stack.key()}"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert "comment" in r.json()["error"]["message"] and "NUL" in r.json()["error"]["message"]
