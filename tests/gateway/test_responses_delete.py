"""``DELETE /v1/responses/{id}`` (OpenAI's delete a model response): the answer
``{"id", "object": "response", "deleted": true}``; then GET, its input items and
``previous_response_id`` are 404, a second delete too, while the interaction record is
kept as it was (records are never rewritten: the delete is a marker). Another project's
response cannot be deleted (404)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.helpers import wait_recorded


def test_delete_hides_the_response_and_keeps_the_record(stack):  # type: ignore[no-untyped-def]
    key = stack.key()
    client = stack.client(key)
    resp = client.responses.create(model="m", input="Say hi.", max_output_tokens=4)
    (before,) = wait_recorded(stack, [resp.id])
    url = f"{stack.gw.url}/v1/responses/{resp.id}"
    auth = {"Authorization": f"Bearer {key}"}

    other = httpx.delete(url, headers={"Authorization": f"Bearer {stack.key(project='p2')}"})
    assert other.status_code == 404
    assert client.responses.retrieve(resp.id).id == resp.id

    r = httpx.delete(url, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": resp.id, "object": "response", "deleted": True}

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(resp.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", input="More.", previous_response_id=resp.id)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    again = httpx.delete(url, headers=auth)
    assert again.status_code == 404 and again.json()["error"]["type"] == "not_found_error"

    (after,) = wait_recorded(stack, [resp.id])  # the record is untouched
    assert after.model_dump() == before.model_dump()
