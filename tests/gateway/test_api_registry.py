"""Each client API registers itself (gateway/api/spec.py): its paths, model calls, error
format, display translator and protocol come from its package, and the gateway's shared
modules name none of them. What an output limit means is gateway/call/output_limit.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.routing import Route

from core.errors import APIError
from gateway.api.display import request_messages
from gateway.api.registry import APIS
from gateway.app import install_error_handlers
from gateway.call.output_limit import OutputLimit, output_limit
from gateway.edge.errors import OPENAI, error_format
from gateway.edge.ratelimit import model_paths
from schemas.atdp import ClientProtocol

ROOT = Path(__file__).resolve().parents[2]
SHARED = (
    "gateway/app.py",
    "gateway/edge/errors.py",
    "gateway/edge/ratelimit.py",
    "gateway/api/display.py",
)


def test_each_api_has_its_protocol_prefix_and_model_routes() -> None:
    assert sorted(a.protocol for a in APIS) == sorted(
        p for p in ClientProtocol if p is not ClientProtocol.areal
    )
    assert all(isinstance(a.protocol, ClientProtocol) for a in APIS)
    prefixes = [a.id_prefix for a in APIS]
    assert len(set(prefixes)) == len(prefixes)
    for api in APIS:
        posts = {r.path for r in api.router.routes if isinstance(r, Route) and "POST" in r.methods}
        assert api.model_paths and api.model_paths <= posts, api.protocol


def test_the_shared_modules_name_no_api_path() -> None:
    paths = {p for api in APIS for p in api.paths}
    for name in SHARED:
        text = (ROOT / name).read_text(encoding="utf-8")
        named = sorted(p for p in paths if f'"{p}' in text)
        assert not named, f"{name} names {named}"


def _scope(app: FastAPI, path: str, headers: dict[str, str] | None = None) -> dict:
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"type": "http", "app": app, "path": path, "headers": raw}


def test_error_format_and_model_paths_come_from_the_registered_apis() -> None:
    app = FastAPI()
    install_error_handlers(app)
    anthropic = error_format(_scope(app, "/v1/messages/count_tokens"))
    assert anthropic is not OPENAI
    assert anthropic.body(APIError(503, "busy")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy"},
    }
    assert error_format(_scope(app, "/v1/models", {"anthropic-version": "1"})) is anthropic
    assert error_format(_scope(app, "/v1/chat/completions")) is OPENAI
    assert OPENAI.body(APIError(503, "busy"))["error"]["type"] == "service_unavailable"
    assert error_format(_scope(FastAPI(), "/v1/messages")) is OPENAI  # no APIs registered
    assert model_paths(app) == {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/completions",
        "/v1/messages",
        "/messages",
        "/v1/responses",
        "/responses",
    }


def test_a_stored_request_is_shown_by_the_api_that_took_it() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert request_messages(chat, "chatcmpl-1")[0]["text"] == "hi"
    anthropic = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    assert [m["role"] for m in request_messages(anthropic, "msg_1")] == ["system", "user"]
    assert [m["role"] for m in request_messages(anthropic)] == ["system", "user"]  # by shape
    responses = {"instructions": "be brief", "input": "hi"}
    assert [m["text"] for m in request_messages(responses)] == ["be brief", "hi"]


def test_output_limit() -> None:
    assert output_limit(8, 10, 100, None) == OutputLimit(8, "client")
    assert output_limit(None, 10, 100, None) == OutputLimit(90, "context")
    assert output_limit(None, 10, 100, 16) == OutputLimit(16, "default")
    assert output_limit(None, 10, 100, 500) == OutputLimit(90, "context")
    # an upper bound (Anthropic): what does not fit gets what the context leaves
    assert output_limit(32000, 10, 100, None, fit=True) == OutputLimit(90, "context")
    assert output_limit(32000, 10, 100, 16, fit=True) == OutputLimit(16, "default")
    with pytest.raises(APIError) as e:
        output_limit(91, 10, 100, None)
    assert e.value.param == "max_tokens" and "you requested 101" in e.value.message
    with pytest.raises(APIError) as e:
        output_limit(None, 100, 100, None, where="prompt", fit=True)
    assert e.value.param == "prompt" and "the prompt is 100 tokens" in e.value.message
