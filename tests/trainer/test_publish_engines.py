"""load_everywhere over several engines: a dead engine (nothing listens) does not hold a
publish back once another engine loaded the adapter; a refusal, or no engine at all
loading it, still fails it. ``warm``: one token through the adapter on each engine, a
failure logged, never raised. Transport-level fakes: no engine process."""

from __future__ import annotations

import json

import httpx
import pytest

from core.engine_http import EngineHTTP
from trainer import publish


def _fake(
    monkeypatch: pytest.MonkeyPatch, dead: set[str], refusing: set[str], cold: bool = False
) -> list[str]:
    """The engines' calls, as ``host`` for a load and ``host generate lora_path
    max_new_tokens`` for a generation; ``cold``: every generation fails with a 500."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if request.url.path == "/generate":
            body = json.loads(request.content)
            calls.append(
                f"{host} generate {body['lora_path']} {body['sampling_params']['max_new_tokens']}"
            )
            if cold:
                return httpx.Response(500, json={"error": {"message": "out of memory"}})
            return httpx.Response(200, json={"text": "a", "meta_info": {}})
        calls.append(host)
        if host in dead:
            raise httpx.ConnectError("connection refused", request=request)
        if host in refusing:
            return httpx.Response(400, json={"success": False, "error_message": "bad path"})
        return httpx.Response(200, json={"success": True})

    def engine(url: str, timeout: float, headers: dict[str, str] | None) -> EngineHTTP:
        return EngineHTTP(url, {}, timeout, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(publish, "_engine", engine)
    return calls


A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


def test_a_dead_engine_is_skipped_when_another_loaded_it(monkeypatch, caplog):
    calls = _fake(monkeypatch, dead={A}, refusing=set())
    publish.load_everywhere([A, B], "p-v1", "/adapters/p/v1")
    assert calls == [A, B]
    assert "unreachable" in caplog.text


def test_each_engine_is_warmed_and_a_failed_warm_is_only_logged(monkeypatch, caplog):
    calls = _fake(monkeypatch, dead=set(), refusing=set())
    publish.warm([A, B], "p-v2")
    assert calls == [f"{A} generate p-v2 1", f"{B} generate p-v2 1"]
    calls = _fake(monkeypatch, dead={A}, refusing=set(), cold=True)
    publish.warm([A, B], "p-v3")  # neither raises: the version still serves
    assert "warming adapter p-v3 on http://127.0.0.1:1" in caplog.text
    assert "out of memory" in caplog.text


def test_no_engine_loading_it_or_a_refusal_fails_the_publish(monkeypatch):
    _fake(monkeypatch, dead={A, B}, refusing=set())
    with pytest.raises(publish.PublishError, match="ConnectError"):
        publish.load_everywhere([A, B], "p-v1", "/adapters/p/v1")
    _fake(monkeypatch, dead={A}, refusing={B})
    with pytest.raises(publish.PublishError, match="bad path"):
        publish.load_everywhere([A, B], "p-v1", "/adapters/p/v1")
    _fake(monkeypatch, dead=set(), refusing={A})
    with pytest.raises(publish.PublishError, match="bad path"):
        publish.load_everywhere([A, B], "p-v1", "/adapters/p/v1")
