"""Storability checks (gateway.edge.storable), the O(n) session stitching hashes, the byte
bound of the Responses store and the classification of database errors. No servers."""

from __future__ import annotations

import json
import random

import pytest
from sqlalchemy.exc import DataError, IntegrityError, InterfaceError, OperationalError

from core.errors import APIError
from gateway.api.openai_responses.store import ResponseStore
from gateway.call.request import Message, ToolCallOut
from gateway.call.sessions import conversation_hash, prefix_hashes
from gateway.edge.storable import MAX_DEPTH, bounded_str, check_body, check_session_fields
from gateway.recording.dead_letters import refused_for_content


def _old_prefix_hashes(messages: list[Message]) -> list[str]:
    """The O(n^2) definition the gateway used before: one full hash per prefix."""
    out = []
    for k in range(len(messages) - 1, 0, -1):
        if messages[k - 1].role == "assistant":
            out.append(conversation_hash(messages[:k]))
    return out


def _random_message(rng: random.Random) -> Message:
    role = rng.choice(["system", "user", "assistant", "tool", "assistant"])
    alphabet = 'ab c,[]{}"\\\n\té😀ü:'
    content = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
    calls = []
    if role == "assistant" and rng.random() < 0.4:
        args = rng.choice(
            ['{"b": 1, "a": [1, 2, {"z": null, "y": "é"}]}', "not json", "", '"x"', "[1,2]"]
        )
        calls = [ToolCallOut(f"call_{i}", f"fn{i}", args) for i in range(rng.randint(1, 2))]
    return Message(
        role,
        content if rng.random() < 0.9 else "",
        calls,
        tool_call_id="call_0" if role == "tool" else None,
    )


def test_prefix_hashes_equal_the_quadratic_definition_on_random_conversations():
    rng = random.Random(1234)
    compared = 0
    for _ in range(300):
        msgs = [_random_message(rng) for _ in range(rng.randint(0, 25))]
        new = prefix_hashes(msgs)
        assert new == _old_prefix_hashes(msgs)
        compared += len(new)
    assert compared > 500  # the inputs did contain many assistant-ended prefixes


def test_prefix_hashes_handle_thousands_of_messages():
    msgs = []
    for i in range(2500):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append(Message(role, f"turn {i} " + "x" * 200))
    hashes = prefix_hashes(msgs)
    assert len(hashes) == 1249  # every prefix that ends with an assistant turn
    assert hashes[0] == conversation_hash(msgs[:2498])  # msgs[2497] is an answer
    assert hashes[-1] == conversation_hash(msgs[:2])
    assert len(set(hashes)) == len(hashes)


def test_deeply_nested_tool_arguments_do_not_break_stitching():
    deep = "[" * 5000 + "]" * 5000
    msgs = [
        Message("user", "hi"),
        Message("assistant", "", [ToolCallOut("c", "f", deep)]),
        Message("user", "again"),
    ]
    assert len(prefix_hashes(msgs)) == 1


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
        ({"metadata": {"k\x00": "v"}}, "a key in metadata"),
        ({"input": "lone \ud800 surrogate"}, "input"),
    ],
)
def test_unstorable_characters_are_a_400_naming_the_place(body, where):
    with pytest.raises(APIError) as e:
        check_body(body)
    assert e.value.status == 400
    assert where in e.value.message
    assert "remove it" in e.value.message


def test_depth_limit():
    ok = json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    assert check_body(ok) is ok
    deep = json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(APIError) as e:
        check_body({"x": deep})
    assert e.value.status == 400 and "nested more than" in e.value.message


def test_json_text_nested_too_deep_is_a_400():
    deep_args = "[" * 5000 + "]" * 5000  # json.loads of it raises RecursionError
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep_args}}
    body = {"messages": [{"role": "assistant", "tool_calls": [call]}]}
    with pytest.raises(APIError) as e:
        check_body(body)
    assert "messages[0].tool_calls[0].function.arguments" in e.value.message
    assert "nested more than" in e.value.message
    mid = json.dumps({"a": json.loads("[" * 100 + "]" * 100)})
    with pytest.raises(APIError):
        check_body({"arguments": mid})
    fine = json.dumps([[1, 2]] * 200) + " and [[[ code {{{ " * 30
    assert check_body({"content": fine, "arguments": json.dumps([[1, 2]] * 200)})


def test_plain_bodies_pass_unchanged():
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo 😀"}], "n": 1}
    assert check_body(body) is body


def test_bounded_strings_and_session_fields():
    assert bounded_str({"task_id": "t1"}, "task_id") == "t1"
    assert bounded_str({}, "task_id") is None
    for bad, words in ((7, "must be a string"), ("x" * 201, "201 characters")):
        with pytest.raises(APIError) as e:
            bounded_str({"task_id": bad}, "task_id")
        assert e.value.status == 400 and words in e.value.message
        assert e.value.param == "task_id"
    check_session_fields("s" * 200, "agent")
    with pytest.raises(APIError) as e:
        check_session_fields("s" * 300, None)
    assert "300 characters" in e.value.message and "X-Session-Id" in e.value.message
    with pytest.raises(APIError):
        check_session_fields(None, {"not": "a string"})


def test_response_store_is_bounded_by_bytes():
    store = ResponseStore(factory=None, capacity=1000, max_bytes=50_000)
    big = {"input": "x" * 10_000}
    for i in range(20):
        store.remember(f"resp_{i}", "p", "s", big, {"text": "ok"})
    assert store.bytes <= 50_000
    assert 1 <= len(store.recent) <= 5
    assert "resp_19" in store.recent and "resp_0" not in store.recent
    assert store.bytes == sum(store._sizes.values())


def test_content_refusals_are_told_from_connection_trouble():
    assert refused_for_content(DataError("INSERT", {}, Exception("value too long")))
    assert refused_for_content(IntegrityError("INSERT", {}, Exception("fk")))
    assert refused_for_content(KeyError("interaction"))
    assert not refused_for_content(OperationalError("INSERT", {}, Exception("conn refused")))
    assert not refused_for_content(InterfaceError("INSERT", {}, Exception("closed")))
    assert not refused_for_content(ConnectionError("reset"))
