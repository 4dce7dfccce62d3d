"""Conversations' ``include`` and ``item_reference`` input items, per OpenAI's reference:
``include`` on the item routes takes the values OpenAI defines (an unknown one is a 400
naming ``include``); an ``item_reference`` in ``responses.create``'s input, or in items
added to a conversation, is the conversation item it names: in the prompt (the model's
prompt ids hold its text), in the record's request and in the conversation. One that
names no item the caller sees is a 404 naming the reference.

On each database, with the gateway in-process in front of a fake engine
(``fake_db_stack``): the prompt is the gateway's render, the items the database's."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.helpers import wait_recorded

SECRET = "The password is swordfish-42."


@pytest.fixture(scope="module")
def stack(fake_db_stack):  # type: ignore[no-untyped-def]
    return fake_db_stack


def _http(stack, key: str) -> httpx.Client:  # type: ignore[no-untyped-def]
    return httpx.Client(
        base_url=stack.gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def test_include_values_are_openais(stack):  # type: ignore[no-untyped-def]
    c = _http(stack, stack.key())
    cid = c.post("/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]}).json()[
        "id"
    ]
    items = c.get(f"/v1/conversations/{cid}/items").json()
    iid = items["data"][0]["id"]
    ok = [("include[]", "message.output_text.logprobs"), ("include", "reasoning.encrypted_content")]
    assert c.get(f"/v1/conversations/{cid}/items", params=ok).json() == items
    one = c.get(f"/v1/conversations/{cid}/items/{iid}", params=ok[:1])
    assert one.status_code == 200 and one.json()["id"] == iid
    for path in (f"/v1/conversations/{cid}/items", f"/v1/conversations/{cid}/items/{iid}"):
        bad = c.get(path, params={"include": "nope.field"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "include", bad.text
        assert "message.output_text.logprobs" in bad.json()["error"]["message"]


def test_item_reference_is_the_item_it_names(stack, model_dir):  # type: ignore[no-untyped-def]
    from gateway.call.templating import load_tokenizer

    key = stack.key()
    c = _http(stack, key)
    cid = c.post("/v1/conversations", json={"items": [{"role": "user", "content": SECRET}]}).json()[
        "id"
    ]
    (item,) = c.get(f"/v1/conversations/{cid}/items").json()["data"]
    ref = {"type": "item_reference", "id": item["id"]}

    r = c.post(
        "/v1/responses",
        json={"model": "m", "input": [ref], "max_output_tokens": 3},
    )
    assert r.status_code == 200, r.text
    (rec,) = wait_recorded(stack, [r.json()["id"]])
    prompt = load_tokenizer(model_dir).decode(rec.prompt_token_ids)
    assert SECRET in prompt
    assert rec.request["input"] == [item]  # the item itself, not the reference

    other = c.post("/v1/conversations").json()["id"]
    added = c.post(f"/v1/conversations/{other}/items", json={"items": [ref]})
    assert added.status_code == 200, added.text
    (copied,) = added.json()["data"]
    assert copied["content"] == item["content"] and copied["id"] != item["id"]

    missing = c.post(
        "/v1/responses",
        json={"model": "m", "input": [{"type": "item_reference", "id": "msg_nope"}]},
    )
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "input[0].id"
    stranger = _http(stack, stack.key(project="elsewhere"))
    hidden = stranger.post("/v1/responses", json={"model": "m", "input": [ref]})
    assert hidden.status_code == 404, hidden.text
