"""Responses ``custom`` tools (gateway/call/custom_tools.py): free-form input, in a Lark or
regex grammar or plain text.

On both engines (the embedded engine and real SGLang, each behind its own gateway, the
packaged model, the official ``openai`` SDK): a forced custom call with a Lark grammar
(non-streaming) and one with a regex (streaming) come back as ``custom_tool_call`` items
whose input matches the grammar (checked by llguidance reading the original Lark, and by
Python's ``re``), input with newlines and quotes included; the record keeps the call and
the logprobs of the masked distribution; the ``custom_tool_call_output`` reaches the next
turn. Then, on the embedded engine: the whole loop sent as input items, 400s in OpenAI's
format, and the grammar on its own (it admits what the parser reads back, nothing else).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.db import make_engine, session_factory
from core.engine_protocol import SGLANG_VERSION
from core.migrate import upgrade
from engine.grammar import GrammarCompiler
from gateway.api.openai_responses.translator import parse_tools
from gateway.call.forced_tools import forced_grammar
from gateway.call.parsing import HermesToolParser, StreamingParser
from gateway.call.request import GenerationRequest, Message, ToolCallOut
from gateway.call.templating import ChatRenderer, call_text, load_tokenizer
from tests.core.test_lark_ebnf import lark_accepts
from tests.gateway.conftest import Stack
from tests.gateway.fake_engine import in_process_gateway
from tests.gateway.helpers import wait_recorded

pytestmark = pytest.mark.timeout(600)

# a bounded patch grammar (so the untrained model always finishes): rules, terminals,
# regex terminals, an optional line, literal quotes, newlines
LARK = r"""
start: "*** Begin Patch" LF hunk "*** End Patch"
hunk: "*** Add File: " NAME LF line line?
line: "+print(\"" TEXT "\")" LF
NAME: /[a-z]{1,8}\.py/
TEXT: /[a-z ]{1,12}/
%import common.LF
"""
REGEX = r'^[0-9]{3}\n"[a-z]{2,5}"$'
TOOLS = [
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
    },
    {
        "type": "custom",
        "name": "code",
        "description": "A code and a word",
        "format": {"type": "grammar", "syntax": "regex", "definition": REGEX},
    },
    {"type": "custom", "name": "note", "description": "Free text"},
    {"type": "function", "name": "get_time", "parameters": {"type": "object"}},
]
ASK = "Add a file that prints hello."


def _stack(
    request: pytest.FixtureRequest, tmp: pytest.TempPathFactory, kind: str
) -> Iterator[Stack]:
    data_dir = tmp.mktemp(f"custom-{kind}")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    settings: dict[str, str] = {}
    if kind == "embedded":
        engine = request.getfixturevalue("engine")
    else:
        engine = request.getfixturevalue("sglang")
        settings["engine_api_key"] = engine.api_key
    db_engine = make_engine(db_url)
    with in_process_gateway(data_dir, db_url, engine.url, **settings) as proc:
        yield Stack(proc, engine, db_url, session_factory(db_engine), data_dir)
    db_engine.dispose()


@pytest.fixture(scope="module")
def embedded_gw(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    yield from _stack(request, tmp_path_factory, "embedded")


@pytest.fixture(scope="module")
def sglang_gw(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    yield from _stack(request, tmp_path_factory, "sglang")


@pytest.fixture(scope="module", params=["embedded", f"sglang-{SGLANG_VERSION}"])
def gw(request: pytest.FixtureRequest) -> Stack:
    return request.getfixturevalue("embedded_gw" if request.param == "embedded" else "sglang_gw")


def _check_recorded(stack: Stack, rid: str, call_id: str, text: str) -> Any:
    """The call recorded: finish ``tool_calls``, the call as sent (a custom one), one
    logprob per token, each finite: sampled from, and reported under, the mask."""
    (rec,) = wait_recorded(stack, [rid])
    assert rec.finish_reason == "tool_calls"
    assert [(c.id, c.type, c.arguments) for c in rec.output.tool_calls] == [
        (call_id, "custom", text)
    ]
    assert len(rec.completion_logprobs) == len(rec.completion_token_ids) > 0
    assert all(math.isfinite(lp) and lp <= 0 for lp in rec.completion_logprobs)
    return rec


def test_forced_custom_calls(gw: Stack, model_dir: Path) -> None:
    c = gw.client()
    r = c.responses.create(
        model="m",
        input=ASK,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=160,
        temperature=0,
    )
    assert r.status == "completed"
    (item,) = r.output
    assert item.type == "custom_tool_call" and item.name == "apply_patch"
    assert item.status == "completed" and item.id.startswith("ctc_")
    assert item.call_id.startswith("call_") and isinstance(item.input, str)
    assert "\n" in item.input and '"' in item.input  # raw text, never JSON-escaped
    assert lark_accepts(LARK, item.input), item.input
    first = _check_recorded(gw, r.id, item.call_id, item.input)

    # the tool's result reaches the next turn, in the same session
    nxt = c.responses.create(
        model="m",
        previous_response_id=r.id,
        input=[{"type": "custom_tool_call_output", "call_id": item.call_id, "output": "DONE-42"}],
        tools=TOOLS,  # type: ignore[arg-type]
        max_output_tokens=4,
    )
    (after,) = wait_recorded(gw, [nxt.id])
    assert after.session_id == first.session_id and after.parent_id == first.id
    prompt = load_tokenizer(model_dir).decode(after.prompt_token_ids)
    assert '<tool_call name="apply_patch">\n' + item.input + "\n</tool_call>" in prompt
    assert "DONE-42" in prompt

    # a regex, streamed
    with c.responses.stream(
        model="m",
        input="Give a code.",
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "custom", "name": "code"},
        max_output_tokens=40,
        temperature=0,
    ) as s:
        events = list(s)
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    (added,) = [e.item for e in events if e.type == "response.output_item.added"]
    (closed,) = [e.item for e in events if e.type == "response.output_item.done"]
    assert added.type == "custom_tool_call" and added.input == "" and added.status == "in_progress"
    assert closed.type == "custom_tool_call" and closed.input == done.input == "".join(deltas)
    assert re.fullmatch(REGEX[1:-1], closed.input), closed.input
    final = events[-1].response  # type: ignore[union-attr]
    assert [(i.type, i.call_id) for i in final.output] == [("custom_tool_call", closed.call_id)]
    _check_recorded(gw, final.id, closed.call_id, closed.input)


def test_the_loop_as_input_items_and_required(embedded_gw: Stack, model_dir: Path) -> None:
    """A client that sends the whole history (no previous_response_id): its custom call
    and the output are in the prompt. ``required`` with one text-format custom tool: any
    text, in the envelope."""
    c = embedded_gw.client()
    r = c.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "Patch it."},
            {"type": "custom_tool_call", "call_id": "c1", "name": "note", "input": 'a "b"\nc'},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "OUT-7"},
        ],
        tools=[TOOLS[2]],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=24,
    )
    rec = wait_recorded(embedded_gw, [r.id])[0]
    prompt = load_tokenizer(model_dir).decode(rec.prompt_token_ids)
    assert '<tool_call name="note">\na "b"\nc\n</tool_call>' in prompt and "OUT-7" in prompt
    if rec.finish_reason == "tool_calls":  # the text was closed within max_output_tokens
        (item,) = r.output
        assert item.type == "custom_tool_call" and item.name == "note"
    else:  # cut: the envelope never closed, so the text is a message
        assert rec.finish_reason == "length"


BAD = [
    ({"format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}, "format.syntax"),
    ({"format": {"type": "grammar", "syntax": "lark"}}, "format.definition"),
    (
        {"format": {"type": "grammar", "syntax": "lark", "definition": "start: a"}},
        "format.definition",
    ),
    ({"format": {"type": "grammar", "syntax": "regex", "definition": "(a"}}, "format.definition"),
    (
        {"format": {"type": "grammar", "syntax": "regex", "definition": "a(?=b)"}},
        "format.definition",
    ),
    (
        {"format": {"type": "grammar", "syntax": "lark", "definition": 'start: "a"\n%ignore " "'}},
        "format.definition",
    ),
    ({"format": {"type": "json"}}, "format.type"),
    ({"name": "bad name"}, "name"),
]


@pytest.mark.parametrize(("change", "param"), BAD)
def test_bad_custom_tools_are_400(embedded_gw: Stack, change: dict[str, Any], param: str) -> None:
    tool = {"type": "custom", "name": "t", **change}
    body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}, tool]}
    r = _post(embedded_gw, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == f"tools[1].{param}"
    assert err["param"] in err["message"] or param == "name"


def test_tool_choice_must_name_a_tool_of_its_kind(embedded_gw: Stack) -> None:
    for choice in ({"type": "custom", "name": "get_time"}, {"type": "function", "name": "note"}):
        r = _post(embedded_gw, {"model": "m", "input": "hi", "tools": TOOLS, "tool_choice": choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text


def _post(stack: Stack, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {stack.key()}"}
    return httpx.post(f"{stack.gw.url}/v1/responses", json=body, headers=headers, timeout=60)


# ---- the grammar and the text format on their own -------------------------------------


def _tools() -> list[Any]:
    return parse_tools(TOOLS)


def _req(choice: Any, tools: list[Any]) -> GenerationRequest:
    return GenerationRequest("openai-responses", "m", [], tools=tools, tool_choice=choice)


def test_the_grammar_admits_only_what_the_parser_reads(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    compiler = GrammarCompiler(tokenizer, len(tokenizer))
    tools = _tools()
    by_name = {t.name: t for t in tools}

    def accepts(tool: str, text: str) -> bool:
        grammar = forced_grammar(_req("required", [by_name[tool]]), "hermes")
        assert grammar is not None
        c = compiler.constraint(compiler.grammar("structural_tag", grammar))
        ok = all(
            c.matcher.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False)
        )
        return ok and c.matcher.is_accepting()

    def call(name: str, text: str) -> str:
        return call_text(ToolCallOut("x", name, text, custom=True))

    patch = '*** Begin Patch\n*** Add File: a.py\n+print("hi there")\n*** End Patch'
    assert accepts("apply_patch", call("apply_patch", patch))
    assert not accepts("apply_patch", call("apply_patch", patch.replace("a.py", "A.py")))
    assert not accepts("apply_patch", "Sure. " + call("apply_patch", patch))
    assert accepts("code", call("code", '123\n"abc"'))
    assert not accepts("code", call("code", '123\n"abc'))
    assert accepts("note", call("note", 'any "text"\n\nat all'))
    assert not accepts("note", call("note", "x") + "more")

    parser = HermesToolParser(frozenset({"apply_patch", "note"}))
    text = (
        "Here.\n"
        + call("apply_patch", patch)
        + "\n"
        + call_text(ToolCallOut("y", "get_time", '{"zone": "UTC"}'))
    )
    content, calls = parser.parse(text)
    assert content == "Here."
    assert [(c.name, c.arguments, c.custom) for c in calls] == [
        ("apply_patch", patch, True),
        ("get_time", '{"zone": "UTC"}', False),
    ]
    # a custom envelope of a tool not offered as custom stays text
    assert HermesToolParser().parse(call("apply_patch", patch)) == (call("apply_patch", patch), [])
    # streaming: the call comes out whole, the text before it as content
    sp = StreamingParser(parser, reasoning=False)
    deltas = [sp.feed(text[i : i + 5]) for i in range(0, len(text), 5)] + [sp.feed("", True)]
    assert "".join(d.content for d in deltas).strip() == "Here."
    assert [c.arguments for d in deltas for c in d.tool_calls] == [patch, '{"zone": "UTC"}']


def test_the_template_shows_custom_tools_and_calls(model_dir: Path) -> None:
    renderer = ChatRenderer(load_tokenizer(model_dir), 2048)
    call = ToolCallOut("c1", "note", 'say "hi"\nbye', custom=True)
    messages = [
        Message("user", "Go."),
        Message("assistant", "", tool_calls=[call]),
        Message("tool", "ok", tool_call_id="c1"),
    ]
    text, _ = renderer.render(messages, _tools())
    assert '<tool_call name="note">\nsay "hi"\nbye\n</tool_call>' in text
    specs = [json.loads(line) for line in text.splitlines() if line.startswith('{"type": "custom"')]
    assert [s["name"] for s in specs] == ["apply_patch", "code", "note"]
    assert specs[0]["format"] == {"type": "grammar", "syntax": "lark", "definition": LARK}
