"""The OpenAI Conversations API, ``responses.create`` with ``conversation`` and
``GET /v1/responses/{id}/input_items``, through the official openai SDK and plain HTTP
for the error cases. The turns need no real model: they run on ``fake_stack``, the unit
tier (the gateway app in-process on SQLite in front of the fake engine,
tests/gateway/fake_engine.py). The routes' walk over stored items (order, paging, delete
markers) runs on a real gateway and the embedded engine on SQLite and PostgreSQL
(``stack``)."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select
from transformers import AutoTokenizer

from core.db import transaction
from core.keys import create_key
from schemas.tables import ConversationItemRow, ProjectRow
from tests.gateway.helpers import interactions, wait_recorded

USER_ITEM = {"type": "message", "role": "user", "content": "Hello there."}
ITEMS = [
    USER_ITEM,
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]},
    {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "2"},
]


@pytest.fixture(scope="module")
def tok(model_dir):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(model_dir))


def _http(stack, key: str | None = None) -> httpx.Client:  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {key or stack.key()}"}
    return httpx.Client(base_url=stack.gw.url, headers=headers, timeout=120)


def _error(r: httpx.Response, status: int, param: str | None = "") -> dict[str, Any]:
    """An error in OpenAI's format with ``status`` (and ``param``, unless "")."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param != "":
        assert err["param"] == param, err
    return err


def test_conversation_routes(stack):
    c = _http(stack)
    r = c.post("/v1/conversations", json={"items": ITEMS, "metadata": {"topic": "demo"}})
    assert r.status_code == 200, r.text
    conv = r.json()
    cid = conv["id"]
    assert cid.startswith("conv_") and conv["object"] == "conversation"
    assert conv["metadata"] == {"topic": "demo"} and isinstance(conv["created_at"], int)
    assert c.get(f"/v1/conversations/{cid}").json() == conv

    # items: newest first by default, each with an id and the API's shape
    page = c.get(f"/v1/conversations/{cid}/items").json()
    assert page["object"] == "list" and page["has_more"] is False
    data = page["data"]
    assert [i["type"] for i in data] == [
        "function_call_output",
        "function_call",
        "message",
        "message",
    ]
    assert page["first_id"] == data[0]["id"] and page["last_id"] == data[-1]["id"]
    user = data[-1]
    assert user["id"].startswith("msg_") and user["role"] == "user"
    assert user["content"] == [{"type": "input_text", "text": "Hello there."}]
    assert data[2]["content"][0]["type"] == "output_text" and data[2]["role"] == "assistant"
    assert data[1]["id"].startswith("fc_") and data[1]["call_id"] == "call_1"
    assert data[0]["output"] == "2"
    ids_asc = [i["id"] for i in reversed(data)]

    # paging: limit, order, after
    first = c.get(f"/v1/conversations/{cid}/items", params={"limit": 2, "order": "asc"}).json()
    assert [i["id"] for i in first["data"]] == ids_asc[:2] and first["has_more"] is True
    rest = c.get(
        f"/v1/conversations/{cid}/items",
        params={"limit": 2, "order": "asc", "after": first["last_id"]},
    ).json()
    assert [i["id"] for i in rest["data"]] == ids_asc[2:] and rest["has_more"] is False
    back = c.get(f"/v1/conversations/{cid}/items", params={"after": ids_asc[2]}).json()
    assert [i["id"] for i in back["data"]] == [ids_asc[1], ids_asc[0]]

    # add items: a list object of the new items
    added = c.post(f"/v1/conversations/{cid}/items", json={"items": [USER_ITEM]}).json()
    assert added["object"] == "list" and len(added["data"]) == 1
    new_id = added["data"][0]["id"]
    assert added["first_id"] == added["last_id"] == new_id
    assert c.get(f"/v1/conversations/{cid}/items", params={"limit": 1}).json()["data"][0]["id"] == (
        new_id
    )
    assert c.get(f"/v1/conversations/{cid}/items/{new_id}").json() == added["data"][0]

    # metadata update
    upd = c.post(f"/v1/conversations/{cid}", json={"metadata": {"topic": "other"}}).json()
    assert upd["id"] == cid and upd["metadata"] == {"topic": "other"}
    assert c.get(f"/v1/conversations/{cid}").json()["metadata"] == {"topic": "other"}

    # delete an item: the conversation comes back, the item is gone from the API only
    after_delete = c.delete(f"/v1/conversations/{cid}/items/{new_id}").json()
    assert after_delete["id"] == cid and after_delete["object"] == "conversation"
    _error(c.get(f"/v1/conversations/{cid}/items/{new_id}"), 404)
    _error(c.delete(f"/v1/conversations/{cid}/items/{new_id}"), 404)
    listed = c.get(f"/v1/conversations/{cid}/items", params={"order": "asc"}).json()
    assert [i["id"] for i in listed["data"]] == ids_asc
    with stack.factory() as db:  # a marker, nothing rewritten
        assert db.get(ConversationItemRow, _seq(stack, new_id)).deleted_at is not None

    # delete the conversation
    gone = c.delete(f"/v1/conversations/{cid}").json()
    assert gone == {"id": cid, "object": "conversation.deleted", "deleted": True}
    _error(c.get(f"/v1/conversations/{cid}"), 404)
    _error(c.get(f"/v1/conversations/{cid}/items"), 404)
    _error(c.delete(f"/v1/conversations/{cid}"), 404)


def _seq(stack, item_id: str) -> int:  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        return db.scalar(select(ConversationItemRow.seq).where(ConversationItemRow.id == item_id))


def test_conversation_errors(fake_stack):
    c = _http(fake_stack)
    cid = c.post("/v1/conversations", json={}).json()["id"]
    err = _error(c.get("/v1/conversations/conv_nope"), 404)
    assert "conv_nope" in err["message"]
    _error(c.post("/v1/conversations/conv_nope/items", json={"items": [USER_ITEM]}), 404)
    _error(c.get(f"/v1/conversations/{cid}/items/msg_nope"), 404)
    # metadata limits
    too_many = {f"k{i}": "v" for i in range(17)}
    _error(c.post("/v1/conversations", json={"metadata": too_many}), 400, "metadata")
    _error(c.post("/v1/conversations", json={"metadata": {"k" * 65: "v"}}), 400, "metadata")
    _error(c.post("/v1/conversations", json={"metadata": {"k": "v" * 513}}), 400, "metadata.k")
    _error(c.post("/v1/conversations", json={"metadata": {"k": 3}}), 400, "metadata.k")
    _error(c.post("/v1/conversations", json={"metadata": []}), 400, "metadata")
    ok = {f"k{i}": "v" * 512 for i in range(16)} | {"k" * 64: "v"}
    ok.pop("k0")
    assert c.post("/v1/conversations", json={"metadata": ok}).status_code == 200
    _error(c.post(f"/v1/conversations/{cid}", json={"metadata": too_many}), 400, "metadata")
    _error(c.post(f"/v1/conversations/{cid}", json={}), 400, "metadata")
    # items
    _error(c.post("/v1/conversations", json={"items": [USER_ITEM] * 21}), 400, "items")
    _error(c.post("/v1/conversations", json={"items": "hi"}), 400, "items")
    _error(c.post("/v1/conversations", json={"items": [{"type": "nope"}]}), 400, "items[0].type")
    bad_role = {"type": "message", "role": "robot", "content": "x"}
    _error(c.post(f"/v1/conversations/{cid}/items", json={"items": [bad_role]}), 400)
    _error(c.post(f"/v1/conversations/{cid}/items", json={"items": []}), 400, "items")
    _error(c.post("/v1/conversations", content=b"[1]"), 400)
    # list parameters
    for params, param in (
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"order": "up"}, "order"),
        ({"after": "msg_nope"}, "after"),
    ):
        _error(c.get(f"/v1/conversations/{cid}/items", params=params), 400, param)
    assert c.get(f"/v1/conversations/{cid}/items", params={"limit": 100}).status_code == 200
    # nothing half-written: the refused creates left no items
    assert c.get(f"/v1/conversations/{cid}/items").json()["data"] == []


def test_conversation_scope(fake_stack):
    mine = _http(fake_stack)
    cid = mine.post("/v1/conversations", json={"items": [USER_ITEM]}).json()["id"]
    other = _http(fake_stack, fake_stack.key(project="p2"))
    _error(other.get(f"/v1/conversations/{cid}"), 404)
    _error(other.get(f"/v1/conversations/{cid}/items"), 404)
    _error(other.delete(f"/v1/conversations/{cid}"), 404)
    body = {"model": "m", "input": "hi", "conversation": cid, "max_output_tokens": 2}
    _error(other.post("/v1/responses", json=body), 404, "conversation")
    feedback = _http(fake_stack, fake_stack.key(kind="feedback"))
    assert feedback.get(f"/v1/conversations/{cid}").status_code == 403
    assert feedback.post("/v1/conversations", json={}).status_code == 403
    assert mine.get(f"/v1/conversations/{cid}").status_code == 200


def test_two_turns_through_a_conversation(fake_stack, tok):
    client = fake_stack.client()
    conv = client.conversations.create(metadata={"task": "colors"})
    assert conv.id.startswith("conv_") and conv.metadata == {"task": "colors"}
    first = client.responses.create(
        model="gpt-5",
        conversation=conv.id,
        input="Name a color.",
        max_output_tokens=8,
        temperature=0,
    )
    assert first.conversation is not None and first.conversation.id == conv.id
    # straight away, streamed, the conversation as an object
    events = list(
        client.responses.create(
            model="gpt-5",
            conversation={"id": conv.id},
            input="Name another one.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    second = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    r1, r2 = wait_recorded(fake_stack, [first.id, second.id])
    # the history reached the model: turn 2's prompt holds turn 1, and both are one session
    prompt = tok.decode(r2.prompt_token_ids)
    assert prompt.count("Name a color.") == 1 and "Name another one." in prompt
    assert r2.prompt_token_ids[: len(r1.prompt_token_ids)] == r1.prompt_token_ids
    assert r1.session_id == r2.session_id and r2.parent_id == first.id
    assert len(interactions(fake_stack, session_id=r1.session_id)) == 2

    # both turns were appended: input, then output, in order
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert [i.type for i in items] == ["message"] * 4
    assert [i.role for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[0].content[0].text == "Name a color."
    assert items[1].id == first.output[-1].id
    assert items[1].content[0].text == first.output_text
    assert items[3].id == second.output[-1].id and items[2].content[0].text == "Name another one."

    # input_items of a response: its own input, with the ids the conversation shows
    listed = list(client.responses.input_items.list(second.id))
    assert len(listed) == 1 and listed[0].id == items[2].id
    assert listed[0].content[0].text == "Name another one."

    # a deleted item is left out of the next turn's history; the records stay as they were
    client.conversations.items.delete(items[0].id, conversation_id=conv.id)
    third = client.responses.create(
        model="gpt-5", conversation=conv.id, input="And one more.", max_output_tokens=2
    )
    (r3,) = wait_recorded(fake_stack, [third.id])
    assert "Name a color." not in tok.decode(r3.prompt_token_ids)
    assert wait_recorded(fake_stack, [first.id])[0].prompt_token_ids == r1.prompt_token_ids

    # conversation with previous_response_id, or unknown: OpenAI's errors
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(
            model="gpt-5", conversation=conv.id, previous_response_id=first.id, input="x"
        )
    assert bad.value.body["param"] == "conversation"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-5", conversation="conv_missing", input="x")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="gpt-5", conversation={"nope": 1}, input="x")


def test_previous_response_id_of_a_conversation_turn_carries_the_conversation(fake_stack, tok):
    """A response made in a conversation, continued with ``previous_response_id``: the
    context is what that response saw (the conversation's earlier items) plus its turn;
    items added to the conversation after it are not."""
    client = fake_stack.client()
    conv = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My cat is called Miso."}]
    )
    first = client.responses.create(
        model="gpt-5", conversation=conv.id, input="Say ok.", max_output_tokens=4, temperature=0
    )
    client.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "Added later."}]
    )
    nxt = client.responses.create(
        model="gpt-5",
        previous_response_id=first.id,
        input="What is my cat called?",
        max_output_tokens=4,
        temperature=0,
    )
    r1, r2 = wait_recorded(fake_stack, [first.id, nxt.id])
    prompt = tok.decode(r2.prompt_token_ids)
    assert prompt.count("My cat is called Miso.") == 1 and "Say ok." in prompt
    assert "Added later." not in prompt and "What is my cat called?" in prompt
    assert r2.prompt_token_ids[: len(r1.prompt_token_ids)] == r1.prompt_token_ids


def test_input_items(fake_stack):
    client = fake_stack.client()
    resp = client.responses.create(
        model="gpt-5", input=ITEMS + [USER_ITEM], max_output_tokens=2, temperature=0
    )
    every = list(client.responses.input_items.list(resp.id, order="asc", limit=100))
    assert [i.type for i in every] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    ids = [i.id for i in every]
    assert len(set(ids)) == 5 and ids[2].startswith("fc_")
    # the same ids on every read; newest first by default; pages by limit and after
    c = _http(fake_stack, client.api_key)
    page = c.get(f"/v1/responses/{resp.id}/input_items", params={"limit": 2}).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [i["id"] for i in page["data"]] == ids[::-1][:2]
    nxt = c.get(
        f"/v1/responses/{resp.id}/input_items", params={"limit": 10, "after": page["last_id"]}
    ).json()
    assert [i["id"] for i in nxt["data"]] == ids[::-1][2:] and nxt["has_more"] is False
    _error(c.get(f"/v1/responses/{resp.id}/input_items", params={"order": "x"}), 400, "order")
    _error(c.get(f"/v1/responses/{resp.id}/input_items", params={"after": "x"}), 400, "after")
    _error(c.get("/v1/responses/resp_nope/input_items"), 404)
    # the visibility of GET /v1/responses/{id}
    _error(
        _http(fake_stack, fake_stack.key(project="p2")).get(f"/v1/responses/{resp.id}/input_items"),
        404,
    )
    fb = _http(fake_stack, fake_stack.key(kind="feedback"))
    assert fb.get(f"/v1/responses/{resp.id}/input_items").status_code == 403
    unstored = client.responses.create(model="gpt-5", input="hi", max_output_tokens=2, store=False)
    _error(c.get(f"/v1/responses/{unstored.id}/input_items"), 404)


def test_conversation_items_are_redacted_like_records(fake_stack):
    """With redaction on for the project, items and metadata are stored redacted."""
    project = f"redact-{secrets.token_hex(3)}"
    with transaction(fake_stack.factory) as db:
        _, key = create_key(db, project, "agent")
        db.get(ProjectRow, project).settings = {"redaction": {"enabled": True}}
    c = _http(fake_stack, key)
    secret = "mail me at jane.doe@example.com"
    item = {"type": "message", "role": "user", "content": secret}
    conv = c.post("/v1/conversations", json={"items": [item], "metadata": {"who": secret}})
    assert conv.status_code == 200, conv.text
    assert conv.json()["metadata"]["who"] == "mail me at [REDACTED:email]"
    cid = conv.json()["id"]
    added = c.post(f"/v1/conversations/{cid}/items", json={"items": [item]}).json()
    assert added["data"][0]["content"][0]["text"] == "mail me at [REDACTED:email]"
    with fake_stack.factory() as db:
        stored = db.scalars(
            select(ConversationItemRow.item).where(ConversationItemRow.conversation_id == cid)
        ).all()
    assert len(stored) == 2 and "example.com" not in json.dumps(stored)
