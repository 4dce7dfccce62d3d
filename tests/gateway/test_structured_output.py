"""Structured output through each API, with the official SDKs' own ``parse`` helpers:
the schema reaches the engine as SGLang's ``json_schema`` param, the embedded engine masks
what the schema forbids (llguidance), the output validates against the schema, and the
record is token-exact like any other output. A bad format the gateway refuses before any
engine is asked runs on ``fake_stack`` (the unit tier, tests/gateway/fake_engine.py); a
schema only the engine's grammar compiler refuses needs the real engine."""

from __future__ import annotations

import json
import math
from typing import Literal

import anthropic
import httpx
import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict

from tests.gateway.helpers import wait_recorded


class Fruit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["apple", "pear", "plum"]
    ripe: bool


SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": ["apple", "pear", "plum"]},
        "ripe": {"type": "boolean"},
    },
    "required": ["kind", "ripe"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Name a fruit and say whether it is ripe, as JSON."}]


def _check_record(stack, interaction_id: str, text: str) -> None:  # type: ignore[no-untyped-def]
    (rec,) = wait_recorded(stack, [interaction_id])
    jsonschema.validate(json.loads(text), SCHEMA)
    assert rec.completion_token_ids and len(rec.completion_logprobs) == len(
        rec.completion_token_ids
    )
    assert all(math.isfinite(lp) for lp in rec.completion_logprobs)  # sampled under the mask


def test_chat_completions_parse(stack):
    client = stack.client()
    for seed in (1, 2):
        raw = client.chat.completions.with_raw_response.parse(
            model="m", messages=ASK, response_format=Fruit, max_tokens=48, seed=seed
        )
        done = raw.parse()
        choice = done.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Fruit)
        _check_record(stack, done.id, choice.message.content)


def test_chat_json_object(stack):
    done = stack.client().chat.completions.create(
        model="m", messages=ASK, response_format={"type": "json_object"}, max_tokens=48, seed=3
    )
    if done.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(done.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of a JSON object
        assert done.choices[0].message.content.lstrip().startswith("{")


def test_responses_parse(stack):
    raw = stack.client().responses.with_raw_response.parse(
        model="m", input=ASK[0]["content"], text_format=Fruit, max_output_tokens=48
    )
    done = raw.parse()
    assert done.status == "completed"
    assert isinstance(done.output_parsed, Fruit)
    _check_record(stack, done.id, done.output_text)


def test_anthropic_messages_parse(stack):
    client = anthropic.Anthropic(
        base_url=stack.gw.url, api_key=stack.key(), max_retries=0, timeout=120
    )
    done = client.messages.parse(
        model="claude-sonnet-4-6", messages=ASK, max_tokens=48, output_format=Fruit
    )
    assert done.stop_reason == "end_turn"
    assert isinstance(done.parsed_output, Fruit)
    _check_record(stack, done.id, done.content[0].text)


@pytest.mark.parametrize(
    ("path", "body", "error_of"),
    [
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": ASK,
                "max_tokens": 4,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
            },
            lambda j: j["error"]["message"],
        ),
        (
            "/v1/responses",
            {"model": "m", "input": "hi", "text": {"format": {"type": "yaml"}}},
            lambda j: j["error"]["message"],
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "messages": ASK,
                "max_tokens": 4,
                "output_config": {"format": {"type": "json_schema", "schema": "nope"}},
            },
            lambda j: j["error"]["message"],
        ),
    ],
)
def test_bad_formats_are_400_in_the_api_format(fake_stack, path, body, error_of):
    _refused(fake_stack, path, body, error_of)


def test_a_schema_the_engine_refuses_is_400_in_the_api_format(stack):
    """A schema the gateway passes on and the engine's grammar compiler refuses."""
    body = {
        "model": "m",
        "messages": ASK,
        "max_tokens": 4,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": 5}},
        },
    }
    _refused(stack, "/v1/chat/completions", body, lambda j: j["error"]["message"])


def _refused(stack, path: str, body: dict, error_of) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(
        stack.gw.url + path,
        json=body,
        headers={"Authorization": f"Bearer {stack.key()}", "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    message = error_of(r.json())
    assert "schema" in message or "format" in message
    if path == "/v1/messages":
        assert r.json()["type"] == "error"
