"""Forced tool calls (gateway/call/forced_tools.py), on both engines: the embedded engine and
real SGLang (the session's server, tests/conftest.py ``sglang``), each behind its own
gateway on SQLite, with the packaged model (which never calls a tool on its own).

Per API (Chat Completions, Responses, Anthropic Messages), ``tool_choice`` required and
named, streamed and not: the answer is tool calls only, of an offered tool (the named
one), whose arguments validate against that tool's schema (each tool has its own
``$defs``, under the same name); finish_reason ``tool_calls`` / ``stop_reason:
"tool_use"`` / ``function_call`` items; ``n > 1`` on Chat; the tool result sent back
gets a next turn in the same session; every turn recorded token-exactly, with the call
ids the client was sent. Field shapes follow the OpenAI and Anthropic API references.
Then the grammar on its own, per tool-call format: it admits what the parser reads back,
and no text, no second call with parallel calls off, no arguments outside the schema.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from core.db import make_engine, session_factory
from core.engine_protocol import SGLANG_VERSION
from core.errors import APIError
from core.migrate import upgrade
from engine.grammar import GrammarCompiler
from gateway.call.forced_tools import forced_grammar
from gateway.call.parsing import TOOL_PARSERS
from gateway.call.request import GenerationRequest, Tool
from gateway.call.templating import load_tokenizer
from tests.gateway.conftest import Stack
from tests.gateway.fake_engine import in_process_gateway
from tests.gateway.helpers import interactions, wait_recorded

pytestmark = pytest.mark.timeout(600)


def _schema(prop: str, names: list[str]) -> dict[str, Any]:
    """An object with one required property whose values are ``$defs/Name``."""
    return {
        "type": "object",
        "properties": {prop: {"$ref": "#/$defs/Name"}},
        "required": [prop],
        "additionalProperties": False,
        "$defs": {"Name": {"type": "string", "enum": names}},
    }


SCHEMAS = {
    "get_weather": _schema("city", ["Paris", "Rome"]),
    "get_time": _schema("zone", ["UTC", "CET"]),  # the same $defs name, its own values
}
DESCRIBED = {"get_weather": "The weather in a city", "get_time": "The time in a zone"}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": n, "description": DESCRIBED[n], "parameters": s}}
    for n, s in SCHEMAS.items()
]
RESPONSES_TOOLS = [
    {"type": "function", "name": n, "description": DESCRIBED[n], "parameters": s}
    for n, s in SCHEMAS.items()
]
ANTHROPIC_TOOLS = [
    {"name": n, "description": DESCRIBED[n], "input_schema": s} for n, s in SCHEMAS.items()
]
ASK = "What is the weather in Paris, and the time in UTC?"
MAX_TOKENS = 96  # one call is about 25 tokens
CHOICES = ["required", "named"]
PARALLEL_FINISH = ("tool_calls", "length")
NAMED = "get_time"


@pytest.fixture(scope="module", params=["embedded", f"sglang-{SGLANG_VERSION}"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp(f"forced-{request.param}")
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


def _check_calls(calls: list[tuple[str, Any]], choice: str, cut: bool = False) -> None:
    """(name, arguments) pairs: at least one, each of an allowed tool, each valid. Where the
    output limit cut the turn (``cut``), the last call may be the cut one: its arguments then
    go only as far as the limit let them (a JSON text's start, or Anthropic's partial input)."""
    assert calls, "a forced turn made no call"
    allowed = set(SCHEMAS) if choice == "required" else {NAMED}
    for i, (name, arguments) in enumerate(calls):
        assert name in allowed, (name, allowed)
        if cut and i == len(calls) - 1:
            assert isinstance(arguments, dict) or arguments.lstrip().startswith("{"), arguments
            continue
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        jsonschema.validate(args, SCHEMAS[name])


def _check_recorded(
    stack: Stack, ids: list[str], calls: list[list[str]], finish: tuple[str, ...] = ("tool_calls",)
) -> list[Any]:
    """Each forced choice recorded: its finish, token-exact logprobs of the masked
    distribution (finite, one per token), and the call ids the client was sent."""
    recs = wait_recorded(stack, ids)
    for rec, sent in zip(recs, calls, strict=True):
        assert rec.finish_reason in finish
        assert len(rec.completion_logprobs) == len(rec.completion_token_ids) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in rec.completion_logprobs)
        assert [c.id for c in rec.output.tool_calls] == sent
        assert rec.output.text is None
    return recs


# ---- Chat Completions -----------------------------------------------------------------


def _chat_choice(choice: str) -> Any:
    return "required" if choice == "required" else {"type": "function", "function": {"name": NAMED}}


def _chat_stream(stack: Stack, key: str, body: dict[str, Any]) -> tuple[str, list[dict], str]:
    """(id, the calls as assembled from the deltas, finish_reason) of a streamed call."""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    cid = ""
    with httpx.stream(
        "POST",
        stack.gw.url + "/v1/chat/completions",
        json={**body, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            cid = chunk["id"]
            for ch in chunk["choices"]:
                assert not ch["delta"].get("content"), "text in a forced turn"
                for d in ch["delta"].get("tool_calls") or []:
                    slot = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
                    slot["id"] = d.get("id") or slot["id"]
                    fn = d.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                finish = ch.get("finish_reason") or finish
    return cid, [calls[i] for i in sorted(calls)], str(finish)


@pytest.mark.parametrize("choice", CHOICES)
def test_chat_completions(gw: Stack, choice: str) -> None:
    key = gw.key()
    c = gw.client(key)
    ask = [{"role": "user", "content": ASK}]
    n = 2 if choice == "required" else 1
    r = c.chat.completions.create(
        model="m",
        messages=ask,  # type: ignore[arg-type]
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        tool_choice=_chat_choice(choice),
        max_tokens=MAX_TOKENS,
        n=n,
    )
    assert len(r.choices) == n
    for ch in r.choices:
        # parallel calls: the packaged model may call until max_tokens cuts it short; the
        # complete calls are the answer either way
        assert ch.finish_reason in PARALLEL_FINISH and ch.message.content is None
        calls = ch.message.tool_calls or []
        assert all(t.type == "function" and t.id for t in calls)
        named = [(t.function.name, t.function.arguments) for t in calls]
        _check_calls(named, choice, cut=ch.finish_reason == "length")
    ids = [f"{r.id}.{i}" for i in range(n)] if n > 1 else [r.id]
    sent = [[t.id for t in ch.message.tool_calls or []] for ch in r.choices]
    _check_recorded(gw, ids, sent, PARALLEL_FINISH)

    # streamed, then the tool results go back and the next turn answers them
    body = {
        "model": "m",
        "messages": ask,
        "tools": CHAT_TOOLS,
        "tool_choice": _chat_choice(choice),
        "max_tokens": MAX_TOKENS,
        "parallel_tool_calls": False,
    }
    sid, calls, finish = _chat_stream(gw, key, body)
    assert finish == "tool_calls" and len(calls) == 1  # parallel calls off: exactly one
    _check_calls([(t["name"], t["arguments"]) for t in calls], choice)
    (first,) = _check_recorded(gw, [sid], [[t["id"] for t in calls]])
    history = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": t["id"],
                    "type": "function",
                    "function": {k: t[k] for k in ("name", "arguments")},
                }
                for t in calls
            ],
        },
        *({"role": "tool", "tool_call_id": t["id"], "content": "sunny, 21 C"} for t in calls),
    ]
    nxt = c.chat.completions.create(
        model="m",
        messages=history,
        tools=CHAT_TOOLS,
        tool_choice="none",
        max_tokens=6,  # type: ignore[arg-type]
    )
    assert nxt.choices[0].message.tool_calls is None
    (after,) = wait_recorded(gw, [nxt.id])
    assert after.session_id == first.session_id and after.parent_id == first.id


# ---- Responses ------------------------------------------------------------------------


def _responses_choice(choice: str) -> Any:
    return "required" if choice == "required" else {"type": "function", "name": NAMED}


@pytest.mark.parametrize("choice", CHOICES)
def test_responses(gw: Stack, choice: str) -> None:
    c = gw.client()
    kw: dict[str, Any] = {
        "model": "m",
        "tools": RESPONSES_TOOLS,
        "tool_choice": _responses_choice(choice),
        "max_output_tokens": MAX_TOKENS,
    }
    r = c.responses.create(input=ASK, **kw)
    assert r.status in ("completed", "incomplete")  # parallel calls: see test_chat_completions
    assert all(item.type == "function_call" for item in r.output), r.output
    named = [(i.name, i.arguments) for i in r.output]  # type: ignore[union-attr]
    _check_calls(named, choice, cut=r.status == "incomplete")
    _check_recorded(gw, [r.id], [[i.call_id for i in r.output]], PARALLEL_FINISH)  # type: ignore[union-attr]

    with c.responses.stream(input=ASK, parallel_tool_calls=False, **kw) as s:
        events = list(s)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response  # type: ignore[union-attr]
    assert events[-1].type == "response.completed" and len(done) == 1
    assert [(i.type, i.call_id) for i in final.output] == [(i.type, i.call_id) for i in done]
    _check_calls([(i.name, i.arguments) for i in done], choice)  # type: ignore[union-attr]
    (first,) = _check_recorded(gw, [final.id], [[i.call_id for i in done]])  # type: ignore[union-attr]

    outputs = [
        {"type": "function_call_output", "call_id": i.call_id, "output": "21 C"} for i in done
    ]  # type: ignore[union-attr]
    nxt = c.responses.create(
        model="m",
        previous_response_id=final.id,
        input=outputs,  # type: ignore[arg-type]
        tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
        max_output_tokens=6,
    )
    assert nxt.status in ("completed", "incomplete")
    assert all(i.type == "message" for i in nxt.output)
    (after,) = wait_recorded(gw, [nxt.id])
    assert after.session_id == first.session_id and after.parent_id == first.id


# ---- Anthropic Messages ---------------------------------------------------------------


def _anthropic_choice(choice: str, **kw: Any) -> dict[str, Any]:
    return {"type": "any", **kw} if choice == "required" else {"type": "tool", "name": NAMED, **kw}


@pytest.mark.parametrize("choice", CHOICES)
def test_anthropic_messages(gw: Stack, choice: str) -> None:
    c = anthropic.Anthropic(base_url=gw.gw.url, api_key=gw.key(), max_retries=0, timeout=300)
    ask = [{"role": "user", "content": ASK}]
    kw: dict[str, Any] = {"model": "m", "tools": ANTHROPIC_TOOLS, "max_tokens": MAX_TOKENS}
    m = c.messages.create(messages=ask, tool_choice=_anthropic_choice(choice), **kw)  # type: ignore[arg-type]
    assert m.stop_reason in ("tool_use", "max_tokens")  # parallel: see test_chat_completions
    assert [b.type for b in m.content] == ["tool_use"] * len(m.content)
    named = [(b.name, b.input) for b in m.content]  # type: ignore[union-attr]
    _check_calls(named, choice, cut=m.stop_reason == "max_tokens")
    _check_recorded(gw, [m.id], [[b.id for b in m.content]], PARALLEL_FINISH)  # type: ignore[union-attr]

    one = _anthropic_choice(choice, disable_parallel_tool_use=True)
    with c.messages.stream(messages=ask, tool_choice=one, **kw) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    _check_calls([(b.name, b.input) for b in final.content], choice)  # type: ignore[union-attr]
    (first,) = _check_recorded(gw, [final.id], [[b.id for b in final.content]])  # type: ignore[union-attr]

    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": "21 C"}  # type: ignore[union-attr]
                for b in final.content
            ],
        },
    ]
    nxt = c.messages.create(
        messages=history, tool_choice={"type": "none"}, **{**kw, "max_tokens": 6}
    )  # type: ignore[arg-type]
    assert all(b.type == "text" for b in nxt.content)
    (after,) = wait_recorded(gw, [nxt.id])
    assert after.session_id == first.session_id and after.parent_id == first.id


# ---- refusals --------------------------------------------------------------------------


def test_forced_choice_with_structured_output_makes_calls(gw: Stack) -> None:
    """``response_format`` shapes a text answer; a forced turn has none: calls win."""
    r = gw.client().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": ASK}],
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        tool_choice=_chat_choice("named"),
        response_format={"type": "json_object"},
        max_tokens=MAX_TOKENS,
        parallel_tool_calls=False,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(
        [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls or []],
        "named",
    )
    assert interactions(gw, id=r.id) or wait_recorded(gw, [r.id])


# ---- the grammar on its own -------------------------------------------------------------


def _request(choice: Any, tools: list[Tool], parallel: bool = True) -> GenerationRequest:
    return GenerationRequest(
        "openai-chat", "m", [], tools=tools, tool_choice=choice, parallel_tool_calls=parallel
    )


TOOLS = [Tool(n, "", s) for n, s in SCHEMAS.items()]


@pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
def test_the_grammar_admits_only_what_the_parser_reads(model_dir, parser: str) -> None:  # type: ignore[no-untyped-def]
    """Per tool-call format: calls the parser reads back are accepted, text and arguments
    against the schema are not; auto and none force nothing."""
    tokenizer = load_tokenizer(model_dir)
    compiler = GrammarCompiler(tokenizer, len(tokenizer))
    fmt = TOOL_PARSERS[parser]

    def call(name: str, args: str) -> str:
        begin, end = fmt.frame(name)
        return begin + args + end

    good = fmt.separator.join(
        [call("get_weather", '{"city": "Rome"}'), call("get_time", '{"zone":"CET"}')]
    )
    _, calls = fmt().parse(good)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome"}),
        ("get_time", {"zone": "CET"}),
    ]

    def accepts(req: GenerationRequest, text: str) -> bool:
        grammar = forced_grammar(req, parser)
        assert grammar is not None
        c = compiler.constraint(compiler.grammar("structural_tag", grammar))
        ok = all(
            c.matcher.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False)
        )
        return ok and c.matcher.is_accepting()

    assert accepts(_request("required", TOOLS), good)
    assert not accepts(_request("required", TOOLS, parallel=False), good)  # one call only
    weather = call("get_weather", '{"city": "Rome"}')
    one_tool = [t for t in TOOLS if t.name == "get_weather"]  # one offered, or one named
    assert accepts(_request("required", one_tool), weather)
    assert not accepts(_request("required", one_tool), fmt.separator.join([weather, weather]))
    assert not accepts(_request("required", TOOLS), "Sure. " + good)
    assert not accepts(
        _request("required", TOOLS), call("get_time", '{"zone": "Paris"}')
    )  # its own $defs
    assert not accepts(_request("required", TOOLS), "")
    assert forced_grammar(_request("auto", TOOLS), parser) is None
    assert forced_grammar(_request("none", TOOLS), parser) is None


def test_forcing_without_a_tool_parser_is_a_400() -> None:
    with pytest.raises(APIError) as e:
        forced_grammar(_request("required", TOOLS), None)
    assert e.value.status == 400 and "RLGATE_TOOL_PARSER" in e.value.message
