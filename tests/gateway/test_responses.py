"""OpenAI Responses through the gateway with the official openai SDK.

Two tiers. ``stack``: a real gateway + real embedded engine (SmolLM2-135M-Instruct) on
SQLite and PostgreSQL, for the token-exact recording of the real model's output.
``fake_stack`` (unit tier): the gateway app in-process on SQLite in front of the fake
engine (tests/gateway/fake_engine.py), for translation, conversation state, validation,
error shapes and the stream's event sequence.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from gateway.api.handler import write_stream
from gateway.api.openai_responses import translator as oresp
from gateway.api.openai_responses.stream import ResponsesStream
from gateway.call.output_limit import OutputLimit
from gateway.call.pipeline import Prepared, StreamEvent
from gateway.call.request import Completion, ToolCallOut
from gateway.call.sessions import SessionContext
from gateway.edge.auth import Principal
from tests.gateway.fake_engine import Answer
from tests.gateway.helpers import counts, run_in_fresh_loop, wait_recorded

Q = "What is the capital of France? Answer in one word."
ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


# Codex sends its sub-agent tools as one Responses `namespace` tool
SPAWN_TOOL = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Spawn a sub-agent.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"],
        "additionalProperties": False,
    },
}
NS_TOOL = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [SPAWN_TOOL],
}


# the add call in the packaged model's (Hermes) format, as the fake engine answers it
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok(model_dir):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(model_dir))


def template_ids(tok, messages: list[dict]) -> list[int]:  # type: ignore[no-untyped-def]
    return tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_non_stream_is_recorded_token_exactly(stack, tok):
    raw = stack.client().responses.with_raw_response.create(
        model="gpt-5", instructions="Be terse.", input=Q, max_output_tokens=12, temperature=0
    )
    resp = raw.parse()
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert raw.headers["x-rlgate-interaction-id"] == resp.id
    assert resp.status in ("completed", "incomplete") and resp.output_text
    (rec,) = wait_recorded(stack, [resp.id])
    assert rec.prompt_token_ids == template_ids(
        tok, [{"role": "system", "content": "Be terse."}, {"role": "user", "content": Q}]
    )
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == resp.output_text
    assert resp.usage.input_tokens == len(rec.prompt_token_ids)
    assert resp.usage.output_tokens == len(rec.completion_token_ids)
    assert rec.request["input"] == Q
    if rec.finish_reason == "length":
        assert resp.status == "incomplete"
        assert resp.incomplete_details.reason == "max_output_tokens"


def _stream(stack) -> list:  # type: ignore[no-untyped-def]
    return list(
        stack.client().responses.create(
            model="gpt-5",
            input=[{"role": "user", "content": [{"type": "input_text", "text": Q}]}],
            max_output_tokens=12,
            temperature=0,
            stream=True,
        )
    )


def test_stream_event_sequence(fake_stack):
    events = _stream(fake_stack)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2
    text = "".join(deltas)
    final = events[-1].response
    assert final.output_text == text == events[-4].text


def test_stream_events_and_record(stack, tok):
    events = _stream(stack)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text
    (rec,) = wait_recorded(stack, [final.id])
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == text
    assert rec.prompt_token_ids == template_ids(tok, [{"role": "user", "content": Q}])
    assert final.usage.output_tokens == len(rec.completion_token_ids)


def test_previous_response_id_continues_the_conversation(fake_stack, tok):
    client = fake_stack.client()
    first = client.responses.create(
        model="gpt-5", input="Name a color.", max_output_tokens=8, temperature=0
    )
    # straight away: the first record may not be committed yet
    second = client.responses.create(
        model="gpt-5",
        previous_response_id=first.id,
        input="Name another one.",
        max_output_tokens=8,
        temperature=0,
        stream=True,
    )
    events = list(second)
    second_id = events[-1].response.id
    assert events[-1].response.previous_response_id == first.id
    third = client.responses.create(
        model="gpt-5", previous_response_id=second_id, input="And one more.", max_output_tokens=4
    )
    r1, r2, r3 = wait_recorded(fake_stack, [first.id, second_id, third.id])
    assert r2.prompt_token_ids[: len(r1.prompt_token_ids) + len(r1.completion_token_ids)] == (
        r1.prompt_token_ids + r1.completion_token_ids
    )
    assert r3.prompt_token_ids[: len(r2.prompt_token_ids)] == r2.prompt_token_ids
    assert tok.decode(r3.prompt_token_ids).count("Name a color.") == 1
    # the whole chain is one session, each call the child of the one before
    assert r1.session_id == r2.session_id == r3.session_id
    assert r2.parent_id == first.id and r3.parent_id == second_id


def test_function_call_round_trip(fake_stack, tok):
    client = fake_stack.client()
    fake_stack.engine.script(Answer.of(tok, CALL))  # the first answer calls the tool
    first = client.responses.create(
        model="gpt-5",
        input="What is 2 + 3? Call the add tool.",
        tools=[ADD_TOOL],
        max_output_tokens=40,
        temperature=0,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls
    for c in calls:  # the call is well-formed
        assert c.name == "add" and isinstance(json.loads(c.arguments), dict) and c.call_id
    # the round trip, with the call written by the client as Codex does
    input_items = [
        {"role": "user", "content": "What is 2 + 3? Call the add tool."},
        {
            "type": "function_call",
            "call_id": "call_abc",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        },
        {"type": "function_call_output", "call_id": "call_abc", "output": "5"},
    ]
    second = client.responses.create(
        model="gpt-5", input=input_items, tools=[ADD_TOOL], max_output_tokens=12, temperature=0
    )
    assert second.status in ("completed", "incomplete") and second.output
    # the same conversation sent to the chat route renders to the same prompt ids
    chat = client.chat.completions.create(
        model="m",
        max_tokens=1,
        temperature=0,
        messages=[
            {"role": "user", "content": "What is 2 + 3? Call the add tool."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_abc", "content": "5"},
        ],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": ADD_TOOL["description"],
                    "parameters": ADD_TOOL["parameters"],
                },
            }
        ],
    )
    rec, chat_rec = wait_recorded(fake_stack, [second.id, chat.id])
    assert rec.prompt_token_ids == chat_rec.prompt_token_ids
    # continuing from a response: its function calls (if any) are in the rebuilt prompt
    third = client.responses.create(
        model="gpt-5",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": "5"} for c in calls]
        or "Thanks.",
        tools=[ADD_TOOL],
        max_output_tokens=4,
    )
    r1, r3 = wait_recorded(fake_stack, [first.id, third.id])
    assert r3.prompt_token_ids[: len(r1.prompt_token_ids)] == r1.prompt_token_ids


def test_codex_request_shape_and_session_header(fake_stack):
    """What codex-cli 0.171 sends (`codex exec`, custom provider, wire_api = "responses"):
    developer messages with item ids, `strict: false` function tools, `reasoning`,
    `include`, `store: false`, `prompt_cache_key`, its own `client_metadata` field, and a
    `session-id` header that names the session."""
    sid = "01a22834-32ee-78a0-8bd3-d67deac8a0a9"
    client = fake_stack.client(default_headers={"session-id": sid, "originator": "codex_exec"})

    def codex_turn(text: str, stream: bool) -> str:
        kw = dict(
            model="rlgate-policy",
            input=[
                {
                    "type": "message",
                    "id": "msg_a5bc9e49-ca23-5f1a-96d3-2fe0bc261294",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Answer briefly."}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                },
            ],
            tools=[{**ADD_TOOL, "strict": False}],
            tool_choice="auto",
            parallel_tool_calls=True,
            reasoning={"summary": "auto"},
            store=False,
            include=["reasoning.encrypted_content"],
            prompt_cache_key=sid,
            max_output_tokens=4,
            extra_body={"client_metadata": {"session_id": sid, "turn_id": "t1"}},
        )
        if not stream:
            return client.responses.create(**kw).id
        events = list(client.responses.create(stream=True, **kw))
        assert events[-1].type in ("response.completed", "response.incomplete")
        return events[-1].response.id

    first, second = codex_turn("Say hi.", False), codex_turn("Something else.", True)
    r1, r2 = wait_recorded(fake_stack, [first, second])
    assert r1.session_id == r2.session_id
    assert r1.request["client_metadata"]["session_id"] == sid  # recorded as sent
    from schemas.tables import SessionRow

    with fake_stack.factory() as db:
        assert db.get(SessionRow, r1.session_id).external_id == sid


def test_namespace_tools_render_as_their_functions(fake_stack):
    """A `namespace` tool contributes its functions: the prompt is the one the same
    functions sent as plain function tools render to."""
    client = fake_stack.client()
    kw = dict(model="gpt-5", input="Say hi.", max_output_tokens=2, temperature=0)
    grouped = client.responses.create(tools=[ADD_TOOL, NS_TOOL], **kw)
    flat = client.responses.create(tools=[ADD_TOOL, SPAWN_TOOL], **kw)
    assert [t.type for t in grouped.tools] == ["function", "namespace"]  # echoed as sent
    rg, rf = wait_recorded(fake_stack, [grouped.id, flat.id])
    assert rg.prompt_token_ids == rf.prompt_token_ids


def test_get_stored_response(fake_stack):
    client = fake_stack.client()
    resp = client.responses.create(model="gpt-5", input="Say hi.", max_output_tokens=4)
    wait_recorded(fake_stack, [resp.id])
    got = client.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text
    with pytest.raises(openai.NotFoundError):
        fake_stack.client(fake_stack.key(project="other")).responses.retrieve(resp.id)


OK = "hi"
BAD = [
    ({"model": "m"}, "input"),
    ({"input": OK, "temperature": 5}, "temperature"),
    ({"input": OK, "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "role"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "text only",
    ),
    ({"input": [{"type": "function_call_output", "output": "5"}]}, "call_id"),
    ({"input": OK, "tools": [{"type": "web_search"}]}, "function"),
    ({"input": OK, "tools": [{**NS_TOOL, "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0]"),
    ({"input": OK, "tools": [{**NS_TOOL, "name": "bad name!"}]}, "tools[0].name"),
    ({"input": OK, "tools": [{"type": "function", "name": "bad name!"}]}, "name"),
    (
        {"input": OK, "tools": [{"type": "function", "name": "f", "parameters": {"type": "x"}}]},
        "JSON Schema",
    ),
    ({"input": OK, "tool_choice": {"type": "function", "name": "nope"}}, "not in tools"),
    ({"input": OK, "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"input": OK, "background": True}, "background"),
    ({"input": OK, "frobnicate": 1}, "frobnicate"),
    ({"input": OK, "max_output_tokens": 100000}, "maximum context length"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_openai_400_and_records_nothing(fake_stack, body, needle):
    key = fake_stack.key()
    before = counts(fake_stack)
    r = httpx.post(
        fake_stack.gw.url + "/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert needle in err["message"] or needle == err.get("param"), err
    assert counts(fake_stack) == before


def test_previous_response_of_another_project_is_404(fake_stack):
    resp = fake_stack.client().responses.create(model="m", input="Say hi.", max_output_tokens=3)
    unstored = fake_stack.client().responses.create(
        model="m", input="Say hi.", max_output_tokens=3, store=False
    )
    wait_recorded(fake_stack, [resp.id, unstored.id])
    before = counts(fake_stack)
    other = fake_stack.client(fake_stack.key(project="other"))
    for prev in (resp.id, "resp_doesnotexist", unstored.id):
        client = fake_stack.client() if prev == unstored.id else other
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(model="m", input="more", previous_response_id=prev)
        assert e.value.body["param"] == "previous_response_id"
    assert counts(fake_stack) == before


# ---- translator units (no gateway) --------------------------------------------------


def _prep() -> Prepared:
    req = oresp.to_internal(
        oresp.parse({"input": "hi", "tools": [ADD_TOOL]}), {"input": "hi"}, [], None
    )
    return Prepared(
        principal=Principal("k", "p", "agent"),
        req=req,
        session=SessionContext("s", None, False),
        prompt_ids=[1, 2, 3],
        adapter=None,
        limit=OutputLimit(50, "client"),
        interaction_id="resp_x",
    )


def _done(ids, lps, text, content, reasoning, calls, prompt_tokens):  # type: ignore[no-untyped-def]
    return Completion(
        index=0,
        output_ids=ids,
        logprobs=lps,
        top_logprobs=None,
        text=text,
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason="tool_calls",
        prompt_tokens=prompt_tokens,
    )


def test_translator_function_call_output():
    call = ToolCallOut("call_1", "add", '{"a": 2, "b": 3}')
    c = _done([5, 6], [-0.1, -0.2], "x", None, None, [call], 3)
    body = oresp.response_body(_prep(), c, "policy")
    resp = openai.types.responses.Response.model_validate(body)
    (item,) = resp.output
    assert item.type == "function_call" and item.call_id == "call_1" and item.name == "add"
    assert json.loads(item.arguments) == {"a": 2, "b": 3}
    assert resp.status == "completed" and resp.usage.output_tokens == 2


def test_translator_stream_events_validate_against_the_sdk():
    call = ToolCallOut("call_1", "add", '{"a": 1, "b": 2}')
    done = _done([5, 6, 7], [-0.1] * 3, "", "Hi", "hmm", [call], 3)
    events = [
        StreamEvent(0, reasoning="hmm", new_ids=[5]),
        StreamEvent(0, content="H", new_ids=[6]),
        StreamEvent(0, content="i", new_ids=[7]),
        StreamEvent(0, tool_calls=[call], finished=done),
    ]

    class _P:
        async def finish_stream(self, prep, completions, on_recorded):  # type: ignore[no-untyped-def]
            pass

    async def run() -> str:
        async def gen():  # type: ignore[no-untyped-def]
            for ev in events[1:]:
                yield ev

        prep = _prep()
        writer = ResponsesStream(prep, "policy")
        out = [b async for b in write_stream(_P(), prep, gen(), events[0], writer)]
        return b"".join(out).decode()

    text = run_in_fresh_loop(run())
    datas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    from pydantic import TypeAdapter

    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    parsed = [adapter.validate_python(d) for d in datas]
    final = parsed[-1].response
    assert parsed[-1].type == "response.completed"
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Hi"
    added = [p.item.id for p in parsed if p.type == "response.output_item.added"]
    assert added == [o.id for o in final.output]


def test_translator_namespace_calls_carry_the_namespace():
    body = {"input": "hi", "tools": [ADD_TOOL, NS_TOOL]}
    req = oresp.to_internal(oresp.parse(body), body, [], None)
    assert [t.name for t in req.tools] == ["add", "spawn_agent"]
    prep = Prepared(
        principal=Principal("k", "p", "agent"),
        req=req,
        session=SessionContext("s", None, False),
        prompt_ids=[1],
        adapter=None,
        limit=OutputLimit(9, "client"),
        interaction_id="r",
    )
    calls = [ToolCallOut("c1", "add", "{}"), ToolCallOut("c2", "spawn_agent", '{"message": "x"}')]
    done = _done([5], [-0.1], "", None, None, calls, 1)
    resp = openai.types.responses.Response.model_validate(oresp.response_body(prep, done, "m"))
    assert [(o.name, o.namespace) for o in resp.output] == [
        ("add", None),
        ("spawn_agent", "multi_agent_v1"),
    ]

    class _P:
        async def finish_stream(self, prep, completions, on_recorded):  # type: ignore[no-untyped-def]
            pass

    async def run() -> str:
        async def gen():  # type: ignore[no-untyped-def]
            if False:
                yield None

        ev = StreamEvent(0, tool_calls=calls, finished=done)
        chunks = write_stream(_P(), prep, gen(), ev, ResponsesStream(prep, "m"))
        return b"".join([b async for b in chunks]).decode()

    datas = [json.loads(x[6:]) for x in run_in_fresh_loop(run()).splitlines() if x[:6] == "data: "]
    from pydantic import TypeAdapter

    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    final = adapter.validate_python(datas[-1]).response
    assert [(o.name, o.namespace) for o in final.output] == [
        ("add", None),
        ("spawn_agent", "multi_agent_v1"),
    ]
