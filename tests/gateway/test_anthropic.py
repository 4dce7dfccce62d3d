"""Anthropic Messages through the gateway with the official anthropic SDK.

Two tiers. ``stack``: a real gateway + real embedded engine (SmolLM2-135M-Instruct) on
SQLite and PostgreSQL, for what the recording of the real model's tokens shows.
``fake_stack`` (unit tier): the gateway app in-process on SQLite in front of the fake
engine (tests/gateway/fake_engine.py), for translation, rendering, validation, error
shapes and the stream's event sequence. Recorded prompts are compared with the
tokenizer's own chat template render, recorded completions with the text the client
received.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import anthropic
import httpx
import pytest
from transformers import AutoTokenizer

from gateway.api.anthropic_messages import translator as am
from gateway.api.anthropic_messages.stream import MessagesStream
from gateway.api.handler import write_stream
from gateway.call.output_limit import OutputLimit, output_limit
from gateway.call.pipeline import Prepared, StreamEvent
from gateway.call.request import Completion, ToolCallOut
from gateway.call.sessions import SessionContext
from gateway.edge.auth import Principal
from tests.gateway.fake_engine import Answer
from tests.gateway.helpers import counts, run_in_fresh_loop, wait_recorded

SYSTEM = "You are a terse assistant."
Q = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
ADD_TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


@pytest.fixture(scope="module")
def tok(model_dir):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(model_dir))


def client(stack, key: str | None = None) -> anthropic.Anthropic:  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(
        base_url=stack.gw.url, api_key=key or stack.key(), max_retries=0, timeout=120
    )


def template_ids(tok, messages: list[dict]) -> list[int]:  # type: ignore[no-untyped-def]
    return tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


# ---- real gateway -------------------------------------------------------------------


def test_non_stream_is_recorded_token_exactly(stack, tok):
    raw = client(stack).messages.with_raw_response.create(
        model="claude-sonnet-4-6",
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=Q,
        max_tokens=12,
        extra_body={"temperature": 0},
    )
    msg = raw.parse()
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert raw.headers["x-rlgate-interaction-id"] == msg.id
    assert msg.stop_reason in ("end_turn", "max_tokens")
    (block,) = msg.content
    assert block.type == "text" and block.text

    (rec,) = wait_recorded(stack, [msg.id])
    assert rec.session_id == raw.headers["x-rlgate-session-id"]
    assert rec.prompt_token_ids == template_ids(tok, [{"role": "system", "content": SYSTEM}, *Q])
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == block.text
    assert len(rec.completion_logprobs) == len(rec.completion_token_ids)
    assert msg.usage.input_tokens == len(rec.prompt_token_ids)
    assert msg.usage.output_tokens == len(rec.completion_token_ids)
    assert rec.request["model"] == "claude-sonnet-4-6"
    assert rec.temperature == 0


def test_stream_events_and_record(stack, tok):
    c = client(stack)
    with c.messages.stream(
        model="claude-haiku-4-5", messages=Q, max_tokens=12, extra_body={"temperature": 0}
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    (rec,) = wait_recorded(stack, [final.id])
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == text
    assert rec.prompt_token_ids == template_ids(tok, Q)
    assert final.usage.output_tokens == len(rec.completion_token_ids)


def test_stream_event_sequence(fake_stack):
    """The raw event sequence, exactly as Anthropic documents it."""
    r = httpx.post(
        fake_stack.gw.url + "/v1/messages?beta=true",
        json={"model": "m", "messages": Q, "max_tokens": 6, "stream": True, "temperature": 0},
        headers={
            "x-api-key": fake_stack.key(),
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "fine-grained-tool-streaming-2025-05-14",
        },
        timeout=120,
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    kinds = [line[len("event: ") :] for line in r.text.splitlines() if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [d["type"] for d in datas] == kinds
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[2] == "content_block_start"
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert datas[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert datas[-2]["usage"]["output_tokens"] >= 1


def test_tool_use_tool_result_round_trip(fake_stack, tok):
    """A conversation with tool_use / tool_result blocks renders exactly like the same
    conversation sent to the OpenAI chat route, and gets a valid answer."""
    key = fake_stack.key()
    messages = [
        {"role": "user", "content": "What is 2 + 3? Use the add tool."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me add them."},
                {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "5"}],
                }
            ],
        },
    ]
    msg = client(fake_stack, key).messages.create(
        model="claude-sonnet-4-6",
        system=SYSTEM,
        messages=messages,
        tools=[ADD_TOOL],
        tool_choice={"type": "auto"},
        max_tokens=16,
        extra_body={"temperature": 0},
    )
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for block in msg.content:
        assert block.type in ("text", "tool_use")
        if block.type == "tool_use":  # a call, if the answer makes one, is well-formed
            assert block.name == "add" and isinstance(block.input, dict) and block.id
    chat = httpx.post(
        fake_stack.gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
        json={
            "model": "m",
            "max_tokens": 1,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": SYSTEM},
                messages[0],
                {
                    "role": "assistant",
                    "content": "Let me add them.",
                    "tool_calls": [
                        {
                            "id": "toolu_01",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_01", "content": "5"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "add",
                        "description": ADD_TOOL["description"],
                        "parameters": ADD_TOOL["input_schema"],
                    },
                }
            ],
        },
    )
    assert chat.status_code == 200, chat.text
    rec, chat_rec = wait_recorded(fake_stack, [msg.id, chat.json()["id"]])
    assert rec.prompt_token_ids == chat_rec.prompt_token_ids
    text = "".join(b.text for b in msg.content if b.type == "text")
    if not rec.output.tool_calls:
        assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == text


# the clamp and the stop reason are the gateway's: the fake engine, like any, stops at
# the max_new_tokens it is sent (finish "length")
def test_max_tokens_beyond_the_context_is_clamped(fake_stack, tok):
    """Claude Code asks for max_tokens=32000 whatever the model: the answer is capped by
    what the context leaves after the prompt, not refused; a cut at the end of the context
    is model_context_window_exceeded, not max_tokens (the client's limit was not reached)."""
    from tests.gateway.conftest import ENGINE_CONTEXT

    base = len(template_ids(tok, [{"role": "user", "content": ""}]))
    filler = " ".join(["cat"] * (ENGINE_CONTEXT - base - 6))
    n = len(template_ids(tok, [{"role": "user", "content": filler}]))
    assert ENGINE_CONTEXT - 10 < n < ENGINE_CONTEXT
    # an answer longer than the room the context leaves
    fake_stack.engine.script(Answer.of(tok, " ".join(["cat"] * 20)))
    msg = client(fake_stack).messages.create(
        model="claude-sonnet-4-6",
        messages=[{"role": "user", "content": filler}],
        max_tokens=32000,
        extra_body={"temperature": 0},
    )
    assert msg.usage.input_tokens == n
    assert msg.usage.output_tokens == ENGINE_CONTEXT - n
    assert msg.stop_reason == "model_context_window_exceeded"


def test_metadata_user_id_names_the_session(fake_stack):
    c = client(fake_stack)
    sid = fake_stack.key()[-12:]
    user_id = json.dumps({"device_id": "d1", "account_uuid": "", "session_id": sid})
    ids = []
    for q in ("Say hi.", "Say bye."):
        raw = c.messages.with_raw_response.create(
            model="claude-sonnet-4-6",
            messages=[{"role": "user", "content": q}],
            max_tokens=3,
            metadata={"user_id": user_id},
        )
        ids.append(raw.headers["x-rlgate-session-id"])
    assert ids[0] == ids[1]
    from schemas.tables import SessionRow

    with fake_stack.factory() as db:
        row = db.get(SessionRow, ids[0])
        assert row.external_id == sid and row.client_protocol == "anthropic-messages"


def test_system_messages_inside_messages_render_where_they_stand(fake_stack, tok):
    """Claude Code sends ``role: "system"`` entries inside ``messages``."""
    convo = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "system", "content": [{"type": "text", "text": "Answer with one word."}]},
        {"role": "user", "content": "And 4 + 4?"},
    ]
    raw = client(fake_stack).messages.with_raw_response.create(
        model="claude-sonnet-4-6", system=SYSTEM, messages=convo, max_tokens=4
    )
    (rec,) = wait_recorded(fake_stack, [raw.parse().id])
    flat = [{"role": m["role"], "content": m["content"]} for m in convo]
    flat[2]["content"] = "Answer with one word."
    assert rec.prompt_token_ids == template_ids(tok, [{"role": "system", "content": SYSTEM}, *flat])


def test_count_tokens_uses_the_policy_template(fake_stack, tok):
    c = client(fake_stack)
    n = c.messages.count_tokens(model="claude-sonnet-4-6", system=SYSTEM, messages=Q)
    assert n.input_tokens == len(template_ids(tok, [{"role": "system", "content": SYSTEM}, *Q]))
    with_tools = c.messages.count_tokens(model="x", messages=Q, tools=[ADD_TOOL])
    assert with_tools.input_tokens > len(template_ids(tok, Q))


def test_models_in_anthropic_format(fake_stack):
    key = fake_stack.key()
    one = httpx.get(
        fake_stack.gw.url + "/v1/models/claude-sonnet-4-6",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    assert one.status_code == 200
    assert one.json()["type"] == "model" and one.json()["id"] == "claude-sonnet-4-6"
    listed = client(fake_stack, key).models.list()
    assert listed.data  # app.py's /v1/models answers (OpenAI or Anthropic format)


OK = [{"role": "user", "content": "hi"}]
BAD = [
    ({"model": "m", "messages": OK}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"model": "m", "max_tokens": 5, "messages": OK, "temperature": 1.5}, "temperature"),
    ({"model": "m", "max_tokens": 0, "messages": OK}, "max_tokens"),
    (
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "x"},
                        }
                    ],
                }
            ],
        },
        "text only",
    ),
    (
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
        },
        "tool_use_id",
    ),
    (
        {"model": "m", "max_tokens": 5, "messages": OK, "tools": [{"name": "bad name!"}]},
        "name",
    ),
    (
        {
            "model": "m",
            "max_tokens": 5,
            "messages": OK,
            "tools": [{"name": "f", "input_schema": {"type": "nonsense"}}],
        },
        "JSON Schema",
    ),
    (
        {
            "model": "m",
            "max_tokens": 5,
            "messages": OK,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        "custom tools",
    ),
    (
        {"model": "m", "max_tokens": 5, "messages": OK, "tool_choice": {"type": "tool"}},
        "not in tools",
    ),
    ({"model": "m", "max_tokens": 5, "messages": OK, "frobnicate": 1}, "frobnicate"),
    (
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 3000}]},
        "context",
    ),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_anthropic_400_and_records_nothing(fake_stack, body, needle):
    key = fake_stack.key()
    before = counts(fake_stack)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and needle in ("max_tokens", "context"):
            continue
        r = httpx.post(
            fake_stack.gw.url + path,
            json=body,
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
            timeout=60,
        )
        assert r.status_code == 400, (path, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert needle in err["error"]["message"], err
    assert counts(fake_stack) == before


def test_auth_errors_in_anthropic_shape(fake_stack):
    before = counts(fake_stack)
    r = httpx.post(fake_stack.gw.url + "/v1/messages", json={"model": "m", "messages": OK})
    assert r.status_code == 401
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        client(fake_stack, "rlg_agent_wrong").messages.create(model="m", max_tokens=2, messages=OK)
    fb = fake_stack.key("feedback")
    with pytest.raises(anthropic.PermissionDeniedError):
        client(fake_stack, fb).messages.create(model="m", max_tokens=2, messages=OK)
    assert counts(fake_stack) == before


# ---- translator units (no gateway) --------------------------------------------------


class _Tok:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):  # type: ignore[no-untyped-def]
        return "".join(chr(96 + i) for i in ids if i != 2)


def _prep(**sampling) -> Prepared:  # type: ignore[no-untyped-def]
    req = am.to_internal(
        {"model": "m", "max_tokens": 50, "messages": OK, "tools": [ADD_TOOL], **sampling}, None
    )
    return Prepared(
        principal=Principal("k", "p", "agent"),
        req=req,
        session=SessionContext("s", None, False),
        prompt_ids=[1, 2, 3],
        adapter=None,
        limit=OutputLimit(50, "client"),
        interaction_id="msg_x",
    )


def _completion(content, calls, reason="tool_calls", ids=(5, 6, 2), text=None):  # type: ignore[no-untyped-def]
    return Completion(
        index=0,
        output_ids=list(ids),
        logprobs=[-0.1] * len(ids),
        top_logprobs=None,
        text=text if text is not None else (content or ""),
        content=content,
        reasoning=None,
        tool_calls=calls,
        finish_reason=reason,
        prompt_tokens=3,
    )


def test_translator_tool_use_block():
    call = ToolCallOut("call_1", "add", '{"a": 2, "b": 3}')
    body = am.message_body(_prep(), _completion("Sure.", [call]), _Tok(), "policy")
    msg = anthropic.types.Message.model_validate(body)
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert msg.content[1].input == {"a": 2, "b": 3} and msg.content[1].name == "add"
    assert msg.usage.input_tokens == 3 and msg.usage.output_tokens == 3


def test_translator_stop_sequence():
    prep = _prep(stop_sequences=["zz", "ef"])
    # ids 3,4,5,6 decode to "cdef"; the engine trimmed the matched "ef" from the text
    c = _completion("cd", [], reason="stop", ids=(3, 4, 5, 6), text="cd")
    body = am.message_body(prep, c, _Tok(), "policy")
    assert body["stop_reason"] == "stop_sequence" and body["stop_sequence"] == "ef"
    c = _completion("cd", [], reason="length", ids=(3, 4))
    assert am.message_body(prep, c, _Tok(), "policy")["stop_reason"] == "max_tokens"
    # the client's max_tokens did not fit (an upper bound on this API): the context or
    # the gateway's default cut the answer, not the client's limit
    prep.limit = output_limit(32000, 3, 8, None, fit=True)
    assert prep.limit == OutputLimit(5, "context")
    assert am.message_body(prep, c, _Tok(), "policy")["stop_reason"] == (
        "model_context_window_exceeded"
    )
    prep.limit = output_limit(32000, 3, 2048, 16, fit=True)
    assert prep.limit == OutputLimit(16, "default")
    assert am.message_body(prep, c, _Tok(), "policy")["stop_reason"] == "end_turn"


async def _collect(prep, events):  # type: ignore[no-untyped-def]
    class _P:
        recorded: list = []
        renderer = SimpleNamespace(context_length=2048)

        async def finish_stream(self, prep, completions, on_recorded):  # type: ignore[no-untyped-def]
            self.recorded.extend(completions)

    async def gen():  # type: ignore[no-untyped-def]
        for ev in events[1:]:
            yield ev

    writer = MessagesStream(prep, _Tok(), "policy")
    chunks = [b async for b in write_stream(_P(), prep, gen(), events[0], writer)]
    return b"".join(chunks).decode()


def test_translator_stream_with_thinking_and_tool_call():
    from anthropic.lib.streaming._messages import accumulate_event

    call = ToolCallOut("call_1", "add", '{"a": 2, "b": 3}')
    done = _completion("Hi", [call])
    done.reasoning = "hmm"
    events = [
        StreamEvent(0, reasoning="hm", new_ids=[5]),
        StreamEvent(0, reasoning="m", content="H", new_ids=[6]),
        StreamEvent(0, content="i", new_ids=[7]),
        StreamEvent(0, tool_calls=[call], finished=done),
    ]
    text = run_in_fresh_loop(_collect(_prep(), events))
    datas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    snapshot = None
    bufs: dict = {}
    for d in datas:
        if d["type"] == "ping":
            continue
        snapshot = accumulate_event(event=d, current_snapshot=snapshot, json_bufs=bufs)
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use"]
    assert snapshot.content[0].thinking == "hmm" and snapshot.content[1].text == "Hi"
    assert snapshot.content[2].input == {"a": 2, "b": 3}
    assert snapshot.stop_reason == "tool_use"
    starts = [d["index"] for d in datas if d["type"] == "content_block_start"]
    stops = [d["index"] for d in datas if d["type"] == "content_block_stop"]
    assert starts == stops == [0, 1, 2]


def test_translator_maps_blocks_to_internal_messages():
    req = am.to_internal(
        {
            "model": "claude-opus-4",
            "max_tokens": 10,
            "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "metadata": {"user_id": "u1"},
            "thinking": {"type": "enabled", "budget_tokens": 2000},
            "top_k": 5,
            "stop_sequences": ["END"],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "q"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "sig"},
                        {"type": "tool_use", "id": "tu", "name": "add", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "tu", "content": "2"},
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        },
        None,
    )
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "a\n\nb"),
        ("user", "q"),
        ("assistant", ""),
        ("tool", "2"),
        ("user", "thanks"),
    ]
    assert req.messages[2].tool_calls[0].name == "add" and req.messages[2].reasoning == "t"
    assert req.messages[3].tool_call_id == "tu"
    assert req.session_hint == "u1" and req.chat_template_kwargs == {"enable_thinking": True}
    assert req.sampling.values["top_k"] == 5 and req.sampling.stop == ["END"]


def test_session_id_from_claude_code_user_id():
    new = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-1"})
    assert am.session_from_user_id(new) == "s-1"
    assert am.session_from_user_id("user_ab12_account_x_session_s-2") == "s-2"
    assert am.session_from_user_id("alice") == "alice"
    assert am.session_from_user_id("") is None and am.session_from_user_id(None) is None


def test_claude_code_default_request_names_the_context_problem(fake_stack):
    """A request captured from Claude Code 2.1.197 in its default mode (`claude -p`, only
    the base URL and key set: 24 tools, adaptive thinking, output_config.effort,
    context_management, max_tokens 32000), replayed as sent. Its prompt is longer than the
    packaged model's context, so the answer is the context-length error with both token
    counts and what to do, never a role or field error."""
    body = json.loads(
        (Path(__file__).parent / "data" / "claude_code_2.1.197_default.json").read_text()
    )
    r = httpx.post(
        fake_stack.gw.url + "/v1/messages?beta=true",
        json=body,
        headers={
            "Authorization": f"Bearer {fake_stack.key()}",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
            "x-claude-code-session-id": "402723f1-3884-45b5-942e-36e021ac3881",
        },
        timeout=120,
    )
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    message = err["error"]["message"]
    m = re.search(r"prompt is (\d+) tokens but the model's context is (\d+) tokens", message)
    assert m, message
    assert int(m.group(1)) > int(m.group(2)) > 0
    assert "docs/clients" in message and "context" in message
