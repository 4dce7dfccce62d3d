"""A forced tool call cut by the output limit (gateway/call/cut_calls.py) is still a call, on
both engines (the embedded engine and real SGLang, the session's ``sglang``), each behind
its own gateway on SQLite, with the packaged model.

The named tool's frame is 18 tokens and its whole call about 30, so a limit of 21 cuts
its arguments. Each API answers the cut call as its own: Chat a ``tool_calls`` entry with
the arguments so far and ``finish_reason: "length"``; Responses an ``incomplete``
``function_call`` (or ``custom_tool_call``) item in an ``incomplete`` response with
``incomplete_details.reason: "max_output_tokens"``; Anthropic a ``tool_use`` block whose
``input`` is the arguments read as far as they parse, with ``stop_reason:
"max_tokens"``. Streamed and not; never the ``<tool_call`` markup as text, in the answer
or in the record (which marks the call ``cut`` and keeps finish ``length``). Then the
reading on its own: cut_calls and partial JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from core.db import make_engine, session_factory
from core.engine_protocol import SGLANG_VERSION
from core.migrate import upgrade
from gateway.call.cut_calls import cut_calls
from gateway.call.partial_json import parse_partial
from gateway.call.request import CustomFormat, Tool
from tests.gateway.conftest import Stack
from tests.gateway.fake_engine import in_process_gateway
from tests.gateway.helpers import wait_recorded

pytestmark = pytest.mark.timeout(600)

SCHEMA = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
CUT = 21  # the frame is 18 tokens, the whole call about 30
ASK = "What is the time in UTC?"
MARKUP = "<tool_call"
# more letters than CUSTOM_CUT tokens can hold (a vocabulary's longest all-letter tokens are
# ~20): with {80}, long word tokens at temperature 1 sometimes finished the call in 12 tokens
LONG = {"type": "grammar", "syntax": "regex", "definition": "^([a-z]{100}){20}$"}
# the envelope's opening (`<tool_call name="word">` and a newline, 24 characters) may be
# sampled in as many tokens at temperature 1 (a grammar admits any spelling of it): with 12
# tokens SGLang once cut inside it, so the call had no input yet
CUSTOM_CUT = 40


@pytest.fixture(scope="module", params=["embedded", f"sglang-{SGLANG_VERSION}"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp(f"cut-{request.param}")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    settings: dict[str, str] = {}
    if request.param == "embedded":
        engine = request.getfixturevalue("engine")
    else:
        engine = request.getfixturevalue("sglang")
        settings["engine_api_key"] = engine.api_key
    db_engine = make_engine(db_url)
    with in_process_gateway(data_dir, db_url, engine.url, **settings) as proc:
        yield Stack(proc, engine, db_url, session_factory(db_engine), data_dir)
    db_engine.dispose()


def _cut_args(arguments: str) -> None:
    """Arguments cut short: not whole JSON, the start of the one object the schema allows."""
    assert MARKUP not in arguments
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    assert arguments.lstrip().startswith("{") or arguments == ""


def _recorded_cut(stack: Stack, rid: str, call_id: str, kind: str = "function") -> None:
    (rec,) = wait_recorded(stack, [rid])
    assert rec.finish_reason == "length"
    assert rec.output.text is None
    (call,) = rec.output.tool_calls
    assert (call.id, call.type, call.cut) == (call_id, kind, True)
    assert MARKUP not in call.arguments


def _sse(stack: Stack, path: str, body: dict[str, Any], headers: dict[str, str]) -> list[Any]:
    """The JSON of each ``data:`` line of a stream (``[DONE]`` as the string)."""
    out: list[Any] = []
    with httpx.stream(
        "POST", stack.gw.url + path, json={**body, "stream": True}, headers=headers, timeout=300
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def test_chat_completions(gw: Stack) -> None:
    key = gw.key()
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": ASK}],
        "tools": [{"type": "function", "function": {"name": "get_time", "parameters": SCHEMA}}],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "max_tokens": CUT,
    }
    r = gw.client(key).chat.completions.create(**body)  # type: ignore[call-overload]
    (choice,) = r.choices
    assert choice.finish_reason == "length"
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    _cut_args(call.function.arguments)
    _recorded_cut(gw, r.id, call.id)

    chunks = _sse(gw, "/v1/chat/completions", body, {"Authorization": f"Bearer {key}"})
    assert chunks[-1] == "[DONE]"
    deltas = [c["choices"][0] for c in chunks[:-1] if c.get("choices")]
    assert not "".join(d["delta"].get("content") or "" for d in deltas)
    calls = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
    (sent,) = calls
    assert sent["function"]["name"] == "get_time"
    _cut_args(sent["function"]["arguments"])
    assert [d["finish_reason"] for d in deltas if d.get("finish_reason")] == ["length"]
    _recorded_cut(gw, chunks[0]["id"], sent["id"])


def test_responses(gw: Stack) -> None:
    c = gw.client()
    kw: dict[str, Any] = {
        "model": "m",
        "input": ASK,
        "tools": [{"type": "function", "name": "get_time", "parameters": SCHEMA}],
        "tool_choice": {"type": "function", "name": "get_time"},
        "max_output_tokens": CUT,
    }
    r = c.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    (item,) = r.output
    assert (item.type, item.status, item.name) == ("function_call", "incomplete", "get_time")  # type: ignore[union-attr]
    _cut_args(item.arguments)  # type: ignore[union-attr]
    _recorded_cut(gw, r.id, item.call_id)  # type: ignore[union-attr]
    stored = c.responses.retrieve(r.id)
    assert [(i.type, i.status) for i in stored.output] == [("function_call", "incomplete")]  # type: ignore[union-attr]

    with c.responses.stream(**kw) as s:
        events = list(s)
    assert events[-1].type == "response.incomplete"
    (done,) = [e.item for e in events if e.type == "response.output_item.done"]
    assert (done.type, done.status) == ("function_call", "incomplete")
    _cut_args(done.arguments)  # type: ignore[union-attr]
    assert not [e for e in events if e.type == "response.output_text.delta"]
    _recorded_cut(gw, events[-1].response.id, done.call_id)  # type: ignore[union-attr]


def test_responses_custom_tool(gw: Stack) -> None:
    """A custom tool's input is cut the same way: raw text so far, the item incomplete."""
    c = gw.client()
    kw: dict[str, Any] = {
        "model": "m",
        "input": "Write a long word.",
        "tools": [{"type": "custom", "name": "word", "format": LONG}],
        "tool_choice": {"type": "custom", "name": "word"},
        "max_output_tokens": CUSTOM_CUT,
    }
    r = c.responses.create(**kw)
    assert r.status == "incomplete"
    (item,) = r.output
    assert (item.type, item.status, item.name) == ("custom_tool_call", "incomplete", "word")  # type: ignore[union-attr]
    assert item.input and item.input.isalpha() and len(item.input) < 2000  # type: ignore[union-attr]
    _recorded_cut(gw, r.id, item.call_id, "custom")  # type: ignore[union-attr]

    with c.responses.stream(**kw) as s:
        events = list(s)
    (done,) = [e.item for e in events if e.type == "response.output_item.done"]
    assert (done.type, done.status) == ("custom_tool_call", "incomplete")
    assert done.input.isalpha() and events[-1].type == "response.incomplete"  # type: ignore[union-attr]


def test_anthropic_messages(gw: Stack) -> None:
    c = anthropic.Anthropic(base_url=gw.gw.url, api_key=gw.key(), max_retries=0, timeout=300)
    kw: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": ASK}],
        "tools": [{"name": "get_time", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "get_time"},
        "max_tokens": CUT,
    }
    m = c.messages.create(**kw)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == CUT
    (block,) = m.content
    assert (block.type, block.name) == ("tool_use", "get_time")  # type: ignore[union-attr]
    zone = block.input.get("zone")  # type: ignore[union-attr]
    assert set(block.input) <= {"zone"}  # type: ignore[union-attr]
    assert zone is None or "UTC".startswith(zone) or "CET".startswith(zone)
    _recorded_cut(gw, m.id, block.id)  # type: ignore[union-attr]

    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens"
    assert [b.type for b in final.content] == ["tool_use"]
    assert isinstance(final.content[0].input, dict)  # type: ignore[union-attr]
    _recorded_cut(gw, final.id, final.content[0].id)  # type: ignore[union-attr]


# ---- the reading on its own ----------------------------------------------------------

TIME = Tool("get_time", "", SCHEMA)
WEATHER = Tool("get_weather", "", {"type": "object"})
NOTE = Tool("note", "", {}, custom=CustomFormat())
FRAME = '<tool_call>\n{"name": "get_time", "arguments": '


@pytest.mark.parametrize(
    ("text", "tools", "want"),
    [
        (FRAME + '{"zone": "U', [TIME], [("get_time", '{"zone": "U', True)]),
        (FRAME + '{"zone": "UTC"}}\n</tool', [TIME], [("get_time", '{"zone": "UTC"}', False)]),
        ('<tool_call>\n{"na', [TIME], [("get_time", "", True)]),
        ('<tool_call>\n{"na', [TIME, WEATHER], []),  # no name yet, two tools: nothing
        (
            FRAME + '{"zone": "UTC"}}\n</tool_call>\n' + FRAME + '{"zo',
            [TIME, WEATHER],
            [("get_time", '{"zone": "UTC"}', False), ("get_time", '{"zo', True)],
        ),
        ('<tool_call name="note">\nhello wor', [NOTE], [("note", "hello wor", True)]),
        ('<tool_call name="note">\nhi\n</tool', [NOTE], [("note", "hi", True)]),
    ],
)
def test_cut_calls_reads_the_frames(text: str, tools: list[Tool], want: list[Any]) -> None:
    got = cut_calls(text, "hermes", tools)
    assert [(c.name, c.arguments, c.cut) for c in got] == want


def test_cut_calls_llama3_json() -> None:
    call = '{"name": "get_time", "parameters": '
    text = call + '{"zone": "UTC"}};' + call + '{"z'
    got = cut_calls(text, "llama3_json", [TIME])
    assert [(c.arguments, c.cut) for c in got] == [('{"zone": "UTC"}', False), ('{"z', True)]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{"city": "Pa', {"city": "Pa"}),
        ('{"a": 1, "ke', {"a": 1}),
        ('{"a": [1, {"b": tr', {"a": [1, {}]}),
        ('{"a": {"b": 1}', {"a": {"b": 1}}),
        ("{", {}),
        ("", None),
    ],
)
def test_partial_json(text: str, want: Any) -> None:
    assert parse_partial(text) == want
