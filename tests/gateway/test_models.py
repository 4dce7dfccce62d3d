"""GET /v1/models in OpenAI's format, and in Anthropic's when asked with its headers."""

from __future__ import annotations

import httpx


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
