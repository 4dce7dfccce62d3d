"""Each client API registers itself (gateway/api/spec.py): its paths, model calls, error
format, display translator and protocol come from its package, and the gateway's shared
modules name none of them. What an output limit means is gateway/call/output_limit.py's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.datastructures import Headers, QueryParams
from starlette.routing import Route

from core.errors import APIError
from core.settings import Settings
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


# ---- an API with its key and its model elsewhere (Gemini's generateContent shape) -------


def _goog_key(scope: dict) -> str | None:
    """Gemini's clients send the key as ``x-goog-api-key`` or as ``?key=``."""
    headers = Headers(scope=scope)
    return headers.get("x-goog-api-key") or QueryParams(scope.get("query_string", b"")).get("key")


def _gemini_like_app() -> tuple[FastAPI, dict[str, asyncio.Event]]:
    """The real edge middleware and error handlers with the registered APIs, plus one API
    that reads its own key and names its model in the path."""
    from gateway.api.spec import ApiSpec
    from gateway.edge.auth import presented_secret
    from gateway.edge.ratelimit import MemoryLimiter, RateLimitMiddleware

    router = APIRouter()
    events = {"entered": asyncio.Event(), "release": asyncio.Event()}

    @router.post("/v1beta/models/{model}:generateContent")
    async def generate(model: str, request: Request) -> StreamingResponse:
        key = presented_secret(request)

        async def body() -> AsyncIterator[bytes]:
            events["entered"].set()
            if model == "held":
                await events["release"].wait()
            yield json.dumps({"model": model, "key": key}).encode()

        return StreamingResponse(body(), media_type="application/json")

    gemini = ApiSpec(
        protocol=ClientProtocol.openai_chat,  # a stand-in: the toy API records nothing
        id_prefix="gemini-",
        router=router,
        model_paths=frozenset({"/v1beta/models/{model}:generateContent"}),
        display=lambda _raw: [],
        credential=_goog_key,
    )
    app = FastAPI()
    app.state.settings = Settings(max_concurrent_per_key=1)
    app.state.limiter = MemoryLimiter()
    install_error_handlers(app)
    app.state.apis = (*app.state.apis, gemini)
    app.include_router(router)
    app.add_middleware(RateLimitMiddleware)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        return {"key": presented_secret(request)}

    return app, events


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_api_reads_its_own_key_and_its_model_paths_are_patterns(
    anyio_backend: str,
) -> None:
    """ApiSpec.credential: the key where the API's clients send it, the same key as any
    other presented or a 400; read under the API's paths only. ApiSpec.model_paths with
    ``{model}``: every model named in the path takes the key's one model-call slot."""
    app, events = _gemini_like_app()
    url = "/v1beta/models/{}:generateContent"
    key, other = "sk-" + "a" * 20, "sk-" + "b" * 20
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        for how in ({"headers": {"x-goog-api-key": key}}, {"params": {"key": key}}):
            r = await c.post(url.format("m1"), **how)
            assert r.status_code == 200 and r.json() == {"model": "m1", "key": key}, how
        same = {"x-goog-api-key": key, "Authorization": f"Bearer {key}"}
        assert (await c.post(url.format("m1"), headers=same)).json()["key"] == key
        r = await c.post(
            url.format("m1"), headers={"x-goog-api-key": key, "Authorization": f"Bearer {other}"}
        )
        assert r.status_code == 400 and "one credential" in r.text, r.text
        r = await c.post("/v1/chat/completions", params={"key": key})
        assert r.json() == {"key": None}  # not under its paths: its reader is not asked
        held = asyncio.create_task(c.post(url.format("held"), headers={"x-goog-api-key": key}))
        await asyncio.wait_for(events["entered"].wait(), 30)
        r = await c.post(url.format("m2"), params={"key": key})
        assert r.status_code == 429, r.text  # another model, the same key's slot
        r = await c.post(url.format("m2"), params={"key": other})
        assert r.status_code == 200, r.text  # another key has its own
        events["release"].set()
        assert (await asyncio.wait_for(held, 30)).status_code == 200
