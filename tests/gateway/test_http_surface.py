"""The HTTP surface, old vs new: a corpus of recorded requests replayed against a real
gateway and the embedded engine, compared with a golden file.

Every request of ``CORPUS`` is sent in order (greedy, temperature 0, so bodies are
deterministic); the route, status code, selected headers and body of each answer are
normalised (generated ids become ``<prefix><n>`` in order of first appearance, so equal ids
stay equal; secrets, timestamps and latencies become placeholders; logprob values are
dropped to their type) and compared with ``tests/gateway/data/http_surface.json``.

The test runs its own engine, without prefix reuse, so the answers do not depend on what
other tests sent before. The golden file is written from the code as it is:
``RLGATE_REGEN_SURFACE=1 pytest tests/gateway/test_http_surface.py -k sqlite``. It was
generated before the API translators were refactored (issue #17); a refactor must pass
against it unchanged. Regenerated for issue #28 (the Conversations API is served): only
the entry "responses conversation" changed, a 400 "not supported" became the 404 of an
unknown conversation.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from core.db import make_engine, session_factory
from core.migrate import upgrade
from tests.conftest import PG_BASE
from tests.gateway.conftest import ENGINE_CONTEXT, Stack
from tests.servers import engine_cmd, free_port, gateway, running

GOLDEN = Path(__file__).parent / "data" / "http_surface.json"
# read at import: the autouse fixture of tests/conftest.py clears RLGATE_* settings
REGEN = os.environ.get("RLGATE_REGEN_SURFACE") == "1"
PROJECT = "surface"

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"
RESP = "/v1/responses"
Q = "What is the capital of France? Answer in one word."
USER = [{"role": "user", "content": Q}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
BAD_SCHEMA = {"type": "object", "properties": {"city": {"type": 12}}}
ANTH = {"anthropic-version": "2023-06-01"}


def _c(name: str, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
    return {"name": name, "method": method, "path": path, "body": body, **kw}


META = ("key", "save", "headers", "path_alias", "settle")


def _api(name: str, path: str, base: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    meta = {k: body.pop(k) for k in META if k in body}
    return _c(name, "POST", path, {**base, **body}, **meta)


def chat(name: str, **body: Any) -> dict[str, Any]:
    return _api(name, CHAT, {"model": "m", "messages": USER, "temperature": 0}, body)


def msgs(name: str, **body: Any) -> dict[str, Any]:
    body["headers"] = {**ANTH, **body.get("headers", {})}
    base = {"model": "claude", "max_tokens": 8, "temperature": 0, "messages": USER}
    return _api(name, MSGS, base, body)


def resp(name: str, **body: Any) -> dict[str, Any]:
    base = {"model": "m", "input": Q, "temperature": 0, "max_output_tokens": 8}
    return _api(name, RESP, base, body)


# ``key`` names the caller (agent by default); ``save`` keeps a value of the answer
# (``body.<path>`` or ``header.<name>``) for later requests, which use it as {{name}}.
CORPUS: list[dict[str, Any]] = [
    # ---- OpenAI chat
    chat("chat", max_tokens=8, save={"chat_id": "body.id"}),
    chat("chat stream", max_tokens=8, stream=True, stream_options={"include_usage": True}),
    chat("chat logprobs", max_tokens=4, logprobs=True, top_logprobs=2),
    chat("chat n=2 stop", max_tokens=6, n=2, stop=["\n"], seed=7, user="u1"),
    chat(
        "chat continued (stitched)",
        max_tokens=6,
        messages=[
            *USER,
            {"role": "assistant", "content": "Paris"},
            {"role": "user", "content": "And Italy?"},
        ],
    ),
    chat("chat tools", max_tokens=24, tools=[TOOL], tool_choice="auto"),
    chat(
        "chat tool round trip",
        max_tokens=8,
        tools=[TOOL],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
        ],
    ),
    chat("chat structured", max_tokens=16, response_format={"type": "json_object"}),
    chat("chat via alias", max_tokens=4, path_alias=True),
    # errors of the chat API
    _c("chat bad json", "POST", CHAT, raw='{"model": "m", "messages": ['),
    _c("chat body not object", "POST", CHAT, [1, 2]),
    chat("chat unknown param", max_tokens=4, frobnicate=True),
    chat("chat functions", max_tokens=4, functions=[]),
    chat("chat logit_bias", max_tokens=4, logit_bias={"1": 1}),
    chat("chat penalty out of range", max_tokens=4, frequency_penalty=2.5),
    chat("chat temperature out of range", temperature=5),
    chat("chat empty messages", messages=[]),
    chat("chat bad role", messages=[{"role": "robot", "content": "x"}]),
    chat("chat image part", messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
    chat(
        "chat tool schema error",
        tools=[{**TOOL, "function": {**TOOL["function"], "parameters": BAD_SCHEMA}}],
    ),
    chat("chat tool name error", tools=[{"type": "function", "function": {"name": "bad name"}}]),
    chat(
        "chat tool_choice unknown",
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "x"}},
    ),
    chat("chat required no tools", tool_choice="required"),
    chat("chat top_logprobs alone", top_logprobs=2),
    chat("chat seed out of range", seed=2**63),
    chat("chat too many stops", stop=["a", "b", "c", "d", "e"]),
    chat("chat template kwargs", chat_template_kwargs={"chat_template": "x"}),
    chat("chat response_format bad", response_format={"type": "grammar"}),
    chat("chat too long", max_tokens=100000),
    chat("chat no key", max_tokens=4, key="none"),
    chat("chat bad key", max_tokens=4, key="invalid"),
    chat("chat feedback key", max_tokens=4, key="feedback"),
    # ---- Anthropic Messages
    msgs("messages", system="Answer briefly.", save={"msg_id": "body.id"}),
    msgs("messages stream", stream=True),
    msgs("messages stop sequence", max_tokens=12, stop_sequences=["\n", "."]),
    msgs(
        "messages tools",
        max_tokens=24,
        tools=[
            {
                "name": "get_weather",
                "description": "w",
                "input_schema": TOOL["function"]["parameters"],
            }
        ],
    ),
    msgs(
        "messages tool result",
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {
                        "type": "tool_use",
                        "id": "tu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "tu_1", "content": "18 C"},
                    {"type": "text", "text": "So?"},
                ],
            },
        ],
    ),
    msgs(
        "messages thinking",
        thinking={"type": "disabled"},
        metadata={"user_id": "user_ab_account_x_session_s-surface"},
    ),
    msgs("messages huge max_tokens", max_tokens=32000, stop_sequences=["\n", "."]),
    _c(
        "count tokens",
        "POST",
        MSGS + "/count_tokens",
        {"model": "claude", "messages": USER, "system": "Be brief."},
        headers=ANTH,
    ),
    _c(
        "count tokens feedback key",
        "POST",
        MSGS + "/count_tokens",
        {"model": "claude", "messages": USER},
        headers=ANTH,
        key="feedback",
    ),
    _c("messages bad json", "POST", MSGS, raw="{", headers=ANTH),
    msgs("messages unknown param", frobnicate=1),
    msgs("messages no max_tokens", max_tokens=None),
    msgs("messages temperature out of range", temperature=1.5),
    msgs("messages bad role", messages=[{"role": "tool", "content": "x"}]),
    msgs(
        "messages image", messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]
    ),
    msgs("messages tool schema error", tools=[{"name": "t", "input_schema": BAD_SCHEMA}]),
    msgs("messages hosted tool", tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    msgs("messages tool_choice any without tools", tool_choice={"type": "any"}),
    msgs("messages thinking bad", thinking={"type": "sometimes"}),
    msgs("messages empty stop", stop_sequences=[""]),
    msgs("messages bad key", key="invalid"),
    msgs("messages feedback key", key="feedback"),
    # ---- OpenAI Responses
    resp("responses", instructions="Answer briefly.", save={"resp_id": "body.id"}),
    resp("responses continued", input="And Italy?", previous_response_id="{{resp_id}}"),
    resp(
        "responses stream", stream=True, save={"resp_stream_id": "header.x-rlgate-interaction-id"}
    ),
    resp(
        "responses items",
        input=[
            {"type": "message", "role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
            {"type": "reasoning", "summary": []},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    ),
    resp("responses text format", text={"format": {"type": "json_object"}}, max_output_tokens=16),
    resp("responses store false", store=False, save={"resp_nostore": "body.id"}),
    _c("responses get", "GET", RESP + "/{{resp_id}}", settle=True),
    _c("responses get stream", "GET", RESP + "/{{resp_stream_id}}", settle=True),
    _c("responses get store false", "GET", RESP + "/{{resp_nostore}}"),
    _c("responses get feedback key", "GET", RESP + "/{{resp_id}}", key="feedback"),
    _c("responses get unknown", "GET", RESP + "/resp_000000000000000000000000"),
    resp("responses continue store false", previous_response_id="{{resp_nostore}}"),
    resp("responses continue unknown", previous_response_id="resp_000000000000000000000000"),
    _c("responses bad json", "POST", RESP, raw="nope"),
    resp("responses unknown param", frobnicate=1),
    resp("responses conversation", conversation="c"),
    resp("responses background", background=True),
    resp("responses truncation", truncation="sometimes"),
    resp("responses empty input", input=[]),
    resp("responses only instructions", input=[{"role": "system", "content": "x"}]),
    resp(
        "responses tool schema error",
        tools=[{"type": "function", "name": "t", "parameters": BAD_SCHEMA}],
    ),
    resp("responses hosted tool", tools=[{"type": "web_search"}]),
    resp("responses bad item", input=[{"type": "image"}]),
    resp("responses bad key", key="invalid"),
    resp("responses feedback key continue", previous_response_id="{{resp_id}}", key="feedback"),
    # ---- models, routes
    _c("models", "GET", "/v1/models"),
    _c("models anthropic", "GET", "/v1/models", headers=ANTH),
    _c("model", "GET", "/v1/models/some-model"),
    _c("model anthropic", "GET", "/v1/models/claude-x", headers=ANTH),
    _c("unknown route", "GET", "/v1/nothing-here"),
    _c("unknown route anthropic", "POST", "/v1/messages/nothing", {}, headers=ANTH),
    _c("wrong method", "GET", CHAT),
    # ---- feedback
    _c(
        "feedback",
        "POST",
        "/feedback",
        {"interaction_id": "{{chat_id}}", "value": 1, "scale": "binary"},
    ),
    _c(
        "feedback by feedback key",
        "POST",
        "/feedback",
        {"interaction_id": "{{msg_id}}", "value": 0, "scale": "binary"},
        key="feedback",
    ),
    _c(
        "feedback unknown id",
        "POST",
        "/feedback",
        {"interaction_id": "chatcmpl-000000000000000000000000", "value": 1},
    ),
    _c(
        "feedback bad value",
        "POST",
        "/feedback",
        {"interaction_id": "{{chat_id}}", "value": "good", "scale": "stars"},
    ),
    # ---- sessions
    _c(
        "session create",
        "POST",
        "/v1/sessions",
        {"task_id": "t1", "agent_name": "a1", "metadata": {"k": 1}},
        save={"sess": "body.id", "sess_key": "body.api_key"},
    ),
    _c("session create bad metadata", "POST", "/v1/sessions", {"metadata": []}),
    _c("session create feedback key", "POST", "/v1/sessions", {}, key="feedback"),
    chat("chat with session key", max_tokens=4, key="{{sess_key}}"),
    msgs("messages with session key", key="{{sess_key}}"),
    _c(
        "feedback session",
        "POST",
        "/feedback",
        {"session": "latest", "value": 1},
        key="{{sess_key}}",
    ),
    _c("session end", "POST", "/v1/sessions/{{sess}}/end", {}),
    _c("session end again", "POST", "/v1/sessions/{{sess}}/end", {}),
    _c("session end unknown", "POST", "/v1/sessions/sess_000000000000000000000000/end", {}),
    chat("chat with ended session key", max_tokens=4, key="{{sess_key}}"),
    chat("chat with x-session-id", max_tokens=4, headers={"X-Session-Id": "client-session-1"}),
    # ---- AReaL
    _c(
        "areal start",
        "POST",
        "/rl/start_session",
        {"task_id": "t2"},
        key="admin",
        save={"areal_key": "body.api_key"},
    ),
    _c("areal start agent session key", "POST", "/rl/start_session", {}, key="{{areal_key}}"),
    _c("areal start bad api_key", "POST", "/rl/start_session", {"api_key": "short"}, key="admin"),
    chat("chat with areal key", max_tokens=4, key="{{areal_key}}", save={"areal_chat": "body.id"}),
    _c(
        "areal set reward",
        "POST",
        "/rl/set_reward",
        {"reward": 0.5, "interaction_id": "{{areal_chat}}"},
        key="{{areal_key}}",
    ),
    _c("areal set reward bad", "POST", "/rl/set_reward", {"reward": "x"}, key="{{areal_key}}"),
    _c("areal end", "POST", "/rl/end_session", {}, key="{{areal_key}}"),
    _c("areal end again", "POST", "/rl/end_session", {}, key="{{areal_key}}"),
]

HEADERS = (
    "content-type",
    "cache-control",
    "retry-after",
    "idempotent-replayed",
    "x-rlgate-session-id",
    "x-rlgate-interaction-id",
    "x-rlgate-policy-version",
)
ID = re.compile(r"\b(chatcmpl-|msg_|resp_|rs_|fc_|call_|sess_|fb_|key_|run_)([0-9a-f]{24})\b")
SECRET = re.compile(r"\brlg_(agent|admin|feedback)_[A-Za-z0-9_-]{20,}")
VARYING = {"created", "created_at", "closed_at", "updated_at", "latency_ms", "ttft_ms", "at"}
FLOATS = {"logprob"}


class Normaliser:
    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def text(self, s: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(0) not in self.ids:
                self.ids[m.group(0)] = f"{m.group(1)}<{len(self.ids) + 1}>"
            return self.ids[m.group(0)]

        return SECRET.sub(r"rlg_\1_<secret>", ID.sub(one, s))

    def value(self, v: Any, key: str | None = None) -> Any:
        if key in VARYING and v is not None:
            return "<varies>"
        if key in FLOATS and isinstance(v, int | float):
            return "<float>"
        if isinstance(v, dict):
            return {k: self.value(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v

    def body(self, r: httpx.Response) -> Any:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            events = []
            for block in r.text.split("\n\n"):
                if not block.strip():
                    continue
                ev: dict[str, Any] = {}
                for line in block.split("\n"):
                    field, _, data = line.partition(": ")
                    if field == "data":
                        ev["data"] = data if data == "[DONE]" else self.value(json.loads(data))
                    else:
                        ev[field] = data
                events.append(ev)
            return events
        try:
            return self.value(r.json())
        except ValueError:
            return self.text(r.text)


def _sub(obj: Any, saved: dict[str, str]) -> Any:
    text = json.dumps(obj)
    for k, v in saved.items():
        text = text.replace("{{" + k + "}}", v)
    return json.loads(text)


@pytest.fixture(scope="module")
def surface_engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An engine of its own without prefix reuse: a prompt's numerics, and so its greedy
    answer, do not depend on what other tests sent before."""
    port = free_port()
    log = tmp_path_factory.mktemp("surface-engine") / "engine.log"
    cmd = engine_cmd(port, "--context-length", str(ENGINE_CONTEXT), "--disable-prefix-reuse")
    with running(cmd, {}, log, port) as p:
        yield p


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def surface(request: Any, surface_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A fresh database and gateway on that engine, per backend."""
    data_dir = tmp_path_factory.mktemp(f"surface-{request.param}")
    name = f"rlgate_surface_{os.getpid()}"
    if request.param == "sqlite":
        db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    else:
        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        db_url = f"{PG_BASE}/{name}"
    upgrade(db_url)
    db_engine = make_engine(db_url)
    try:
        with gateway(data_dir, db_url, surface_engine.url) as gw:
            yield Stack(gw, surface_engine, db_url, session_factory(db_engine), data_dir)
    finally:
        db_engine.dispose()
        if request.param == "postgresql":
            with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def _settle(http: httpx.Client, admin: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = http.get("/health", headers={"Authorization": f"Bearer {admin}"}).json()
        if health.get("recording_pending") == 0:
            return
        time.sleep(0.05)


def replay(stack: Any) -> list[dict[str, Any]]:
    keys = {
        "agent": stack.key("agent", PROJECT),
        "feedback": stack.key("feedback", PROJECT),
        "admin": stack.key("admin", PROJECT),
        "invalid": "rlg_agent_" + "x" * 43,
    }
    saved: dict[str, str] = {}
    norm = Normaliser()
    out = []
    with httpx.Client(base_url=stack.gw.url, timeout=120) as http:
        for case in CORPUS:
            case = _sub(case, saved)
            if case.get("settle"):  # a read of the database: wait for the recorder
                _settle(http, keys["admin"])
            path = case["path"]
            if case.get("path_alias"):
                path = path.removeprefix("/v1")
            headers = dict(case.get("headers") or {})
            key = case.get("key", "agent")
            if key != "none":
                headers["Authorization"] = f"Bearer {keys.get(key, key)}"
            body = case["body"]
            if isinstance(body, dict):
                body = {k: v for k, v in body.items() if v is not None}
            if "raw" in case:
                headers["Content-Type"] = "application/json"
                r = http.request(case["method"], path, content=case["raw"], headers=headers)
            elif body is None:
                r = http.request(case["method"], path, headers=headers)
            else:
                r = http.request(case["method"], path, json=body, headers=headers)
            for name, where in (case.get("save") or {}).items():
                kind, _, field = where.partition(".")
                value: Any = r.headers.get(field) if kind == "header" else r.json()
                if kind == "body":
                    for part in field.split("."):
                        value = value[part]
                saved[name] = value
            out.append(
                {
                    "name": case["name"],
                    "route": f"{case['method']} {norm.text(path)}",
                    "status": r.status_code,
                    "headers": {h: norm.text(r.headers[h]) for h in HEADERS if h in r.headers},
                    "body": norm.body(r),
                }
            )
    return out


def test_http_surface_matches_golden(surface):
    got = replay(surface)
    if REGEN:
        GOLDEN.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert [c["name"] for c in got] == [c["name"] for c in want]
    for g, w in zip(got, want, strict=True):
        assert g == w, f"{g['name']}: the answer differs from the golden file"
