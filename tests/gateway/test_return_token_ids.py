"""``return_token_ids`` (vLLM's opt-in) on Chat Completions, Responses and Anthropic
Messages: the answer carries the prompt's ids and the sampled ids, equal to the record;
without it the answer has neither."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.helpers import wait_recorded

Q = "Say hi."
pytestmark = pytest.mark.parametrize("stack", ["sqlite"], indirect=True)


def post(stack, path: str, body: dict, **headers: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    h = {"Authorization": f"Bearer {stack.key()}", **headers}
    r = httpx.post(stack.gw.url + path, json=body, headers=h, timeout=120)
    assert r.status_code == 200, r.text
    return r


def events(r: httpx.Response) -> list:  # type: ignore[no-untyped-def]
    data = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    return [json.loads(x) for x in data if x != "[DONE]"]


def check(stack, iid: str, prompt_ids: list[int], ids: list[int]) -> None:  # type: ignore[no-untyped-def]
    (rec,) = wait_recorded(stack, [iid])
    assert rec.prompt_token_ids == prompt_ids and rec.completion_token_ids == ids
    assert ids


def test_chat(stack):
    body = {"messages": [{"role": "user", "content": Q}], "max_tokens": 4, "temperature": 0}
    plain = post(stack, "/v1/chat/completions", body).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    got = post(stack, "/v1/chat/completions", {**body, "return_token_ids": True}).json()
    check(stack, got["id"], got["prompt_token_ids"], got["choices"][0]["token_ids"])

    r = post(stack, "/v1/chat/completions", {**body, "stream": True, "return_token_ids": True})
    chunks = events(r)
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids", [])]
    check(stack, chunks[0]["id"], chunks[0]["prompt_token_ids"], ids)


def test_responses(stack):
    body = {"input": Q, "max_output_tokens": 4, "temperature": 0, "return_token_ids": True}
    got = post(stack, "/v1/responses", body).json()
    check(stack, got["id"], got["prompt_token_ids"], got["token_ids"])

    r = post(stack, "/v1/responses", {**body, "stream": True})
    ends = ("response.completed", "response.incomplete")
    done = next(e for e in events(r) if e["type"] in ends)["response"]
    check(stack, done["id"], done["prompt_token_ids"], done["token_ids"])


def test_anthropic(stack):
    body = {
        "model": "rlgate-policy",
        "messages": [{"role": "user", "content": Q}],
        "max_tokens": 4,
        "temperature": 0,
        "return_token_ids": True,
    }
    h = {"anthropic-version": "2023-06-01"}
    got = post(stack, "/v1/messages", body, **h).json()
    check(stack, got["id"], got["prompt_token_ids"], got["token_ids"])

    evs = events(post(stack, "/v1/messages", {**body, "stream": True}, **h))
    start = next(e for e in evs if e["type"] == "message_start")["message"]
    delta = next(e for e in evs if e["type"] == "message_delta")
    check(stack, start["id"], start["prompt_token_ids"], delta["token_ids"])
