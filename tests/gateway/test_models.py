"""GET /v1/models in OpenAI's format, and in Anthropic's when asked with its headers.

On each database, with the gateway in-process in front of a fake engine
(``fake_db_stack``, which reports the session engine's 2048-token context)."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def stack(fake_db_stack):  # type: ignore[no-untyped-def]
    return fake_db_stack


def test_models_openai_and_anthropic_formats(stack):
    key = stack.key()
    r = httpx.get(stack.gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    assert r.json()["object"] == "list" and r.json()["data"][0]["id"] == "rlgate-policy"

    a = httpx.get(
        stack.gw.url + "/v1/models", headers={"x-api-key": key, "anthropic-version": "2023-06-01"}
    )
    assert a.status_code == 200
    body = a.json()
    assert body["data"][0]["type"] == "model" and "has_more" in body

    bad = httpx.get(
        stack.gw.url + "/v1/models",
        headers={"x-api-key": "nope", "anthropic-version": "2023-06-01"},
    )
    assert bad.status_code == 401
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "authentication_error"


def test_models_report_the_context_length(stack):
    """OpenAI-format entries carry the policy's context (the engine's --context-length
    here, smaller than the model's own) as ``context_length`` and vLLM's ``max_model_len``."""
    from tests.gateway.conftest import ENGINE_CONTEXT

    headers = {"Authorization": f"Bearer {stack.key()}"}
    listed = httpx.get(stack.gw.url + "/v1/models", headers=headers).json()["data"][0]
    one = httpx.get(stack.gw.url + "/v1/models/gpt-5", headers=headers).json()
    for entry in (listed, one):
        assert entry["context_length"] == ENGINE_CONTEXT, entry
        assert entry["max_model_len"] == ENGINE_CONTEXT, entry
    assert one["id"] == "gpt-5"
