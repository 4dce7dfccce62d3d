"""OpenTelemetry traces of model calls (issue 41, item 2; gateway/call/tracing.py): a real OTLP
receiver on loopback (tests/gateway/otlp_receiver.py, the protocol's own protobuf
messages) gets the spans a real gateway exports, with the GenAI attributes, the child
spans for the engine and the recording, and the caller's ``traceparent`` as parent. No
prompt or answer text unless content capture is on, and then redacted as records are; a
collector that is down or silent never fails or holds a call; without an endpoint
nothing of OpenTelemetry's SDK is loaded."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from core.settings import ConfigError, Settings
from schemas.tables import ProjectRow
from tests.gateway.fake_engine import IDS, TEXT, FakeEngine, fast_stack, serving
from tests.gateway.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.servers import REPO, gateway

pytestmark = pytest.mark.timeout(300)

CHAT = "/v1/chat/completions"
MARKER = "ZEBRA-7731-QUILL"  # prompt text that must never reach a span unless asked for
EMAIL = "alice.liddell@example.com"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(autouse=True)
def _fast_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch processor exports every 50 ms (default 5 s); the exporter gives up after
    2 s (default 10 s), so a gateway with a dead collector stops quickly."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(name, raising=False)


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _calls(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == "SPAN_KIND_SERVER"]


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.name == name]


def _complete(spans: list[ReceivedSpan], calls: int) -> bool:
    """``calls`` call spans, each with its recording span."""
    done = _calls(spans)
    return len(done) >= calls and all(_children(spans, c, "rlgate.record") for c in done)


def _text(spans: list[ReceivedSpan]) -> str:
    """Every attribute and event of every span, as one text to search."""
    return json.dumps([[s.name, s.attributes, s.events, s.resource] for s in spans])


# ---- acceptance: a real gateway process ----------------------------------------------------


def test_a_traceparent_continues_into_a_gateway_process(
    tmp_path: Path, model_dir: Path, receiver: OtlpReceiver
) -> None:
    """A call made with a ``traceparent`` produces a gateway span whose parent is the
    caller's span, with the GenAI attributes; the engine request and the recording are its
    children, and the engine gets the engine span's own ``traceparent``."""
    db_url = f"sqlite:///{tmp_path / 'rlgate.db'}"
    upgrade(db_url)
    db = make_engine(db_url)
    with transaction(session_factory(db)) as s:
        _, key = create_key(s, "p1", "agent")
    db.dispose()
    engine = FakeEngine()
    with (
        serving(engine.app()) as engine_url,
        gateway(tmp_path, db_url, engine_url, otlp_endpoint=receiver.url) as gw,
    ):
        header, trace_id, caller = _traceparent()
        r = httpx.post(
            gw.url + CHAT,
            json={
                "model": "rlgate-policy",
                "messages": [{"role": "user", "content": f"hello {MARKER}"}],
                "temperature": 0.5,
                "top_p": 0.9,
                "max_tokens": 20,
                "seed": 7,
            },
            headers={"Authorization": f"Bearer {key}", "traceparent": header},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        spans = receiver.wait_for(lambda s: _complete(s, 1))

    assert receiver.posts and set(receiver.posts) == {"/v1/traces"}
    (call,) = _calls(spans)
    assert call.trace_id == trace_id and call.parent_span_id == caller
    assert call.name == "chat rlgate-policy"
    assert call.status != "STATUS_CODE_ERROR"
    assert call.resource["service.name"] == "rlgate-gateway"
    a = call.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "rlgate"
    assert a["gen_ai.request.model"] == "rlgate-policy"
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.request.max_tokens"] == 20
    assert a["gen_ai.request.seed"] == 7
    assert a["gen_ai.response.id"] == body["id"]
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"] == len(IDS)
    assert a["gen_ai.conversation.id"] == r.headers["X-Rlgate-Session-Id"]
    assert a["rlgate.session.id"] == r.headers["X-Rlgate-Session-Id"]
    assert a["rlgate.interaction.id"] == r.headers["X-Rlgate-Interaction-Id"] == body["id"]
    assert a["rlgate.policy.version"] == r.headers["X-Rlgate-Policy-Version"] == "base"
    assert a["rlgate.project"] == "p1"
    assert a["http.response.status_code"] == 200
    assert "gen_ai.request.stream" not in a

    (eng,) = _children(spans, call, "engine generate")
    assert eng.kind == "SPAN_KIND_CLIENT" and eng.trace_id == trace_id
    assert eng.attributes["server.address"] == "127.0.0.1"
    assert eng.attributes["server.port"] == int(engine_url.rsplit(":", 1)[1])
    assert eng.attributes["rlgate.engine.url"] == engine_url
    assert eng.attributes["rlgate.engine.rid"] == engine.arrivals[0]["rid"]
    # the engine got the engine span's traceparent: the trace goes on into it
    assert engine.traceparents == [f"00-{trace_id}-{eng.span_id}-01"]

    (rec,) = _children(spans, call, "rlgate.record")
    assert rec.kind == "SPAN_KIND_INTERNAL"
    assert rec.attributes["rlgate.records"] == 1
    assert rec.attributes["rlgate.committed"] is True
    assert MARKER not in _text(spans) and TEXT not in _text(spans)


# ---- the fast tier: the gateway in this process, before the fake engine ------------------


def test_every_api_streams_and_batches(
    tmp_path: Path, model_dir: Path, receiver: OtlpReceiver
) -> None:
    """Each API's calls are spans (chat streamed with n=2, Anthropic, the Completions API
    with two prompts: one call, text_completion); without a traceparent a call span is
    a root; no prompt or answer text in any span by default."""
    with fast_stack(tmp_path, model_dir, otlp_endpoint=receiver.url) as st:
        msg = [{"role": "user", "content": f"hi {MARKER}"}]
        r = st.post(CHAT, {"model": "m", "messages": msg, "stream": True, "n": 2})
        assert r.status_code == 200 and "[DONE]" in r.text
        r = st.post("/v1/messages", {"model": "claude-x", "max_tokens": 30, "messages": msg})
        assert r.status_code == 200, r.text
        anthropic_id = r.json()["id"]
        r = st.post("/v1/completions", {"model": "m", "prompt": [MARKER, "b"], "max_tokens": 9})
        assert r.status_code == 200, r.text
        batch_ids = r.headers["X-Rlgate-Interaction-Ids"].split(",")
        spans = receiver.wait_for(lambda s: _complete(s, 3))
        sent = list(st.engine.traceparents)

    # every engine request, streamed or not, carried its own engine span's traceparent
    engine_spans = [s for s in spans if s.name == "engine generate"]
    assert len(sent) == len(engine_spans) == 5  # 2 choices + 1 + 2 prompts
    # (the flags: sampled, and random trace id on the SDKs that set that W3C level 2 bit)
    assert sorted(tp[:-3] for tp in sent) == sorted(
        f"00-{e.trace_id}-{e.span_id}" for e in engine_spans
    )

    by_api = {s.attributes["rlgate.api"]: s for s in _calls(spans)}
    assert set(by_api) == {"openai-chat", "anthropic-messages", "openai-completions"}
    for call in by_api.values():
        assert call.parent_span_id == ""  # no traceparent: the call starts its trace
        assert len(_children(spans, call, "rlgate.record")) == 1

    stream = by_api["openai-chat"]
    a = stream.attributes
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.request.choice.count"] == 2
    assert a["gen_ai.response.finish_reasons"] == ["stop", "stop"]
    assert a["gen_ai.usage.output_tokens"] == 2 * len(IDS)
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert len(a["rlgate.row.ids"]) == 2
    engines = _children(spans, stream, "engine generate")
    assert sorted(e.attributes["rlgate.choice_index"] for e in engines) == [0, 1]

    anthropic = by_api["anthropic-messages"].attributes
    assert anthropic["gen_ai.operation.name"] == "chat"
    assert anthropic["gen_ai.request.model"] == "claude-x"
    assert anthropic["gen_ai.response.id"] == anthropic_id
    assert by_api["anthropic-messages"].name == "chat claude-x"

    batch = by_api["openai-completions"]
    assert batch.name == "text_completion m"
    assert batch.attributes["gen_ai.operation.name"] == "text_completion"
    assert batch.attributes["rlgate.interaction.ids"] == batch_ids
    assert batch.attributes["gen_ai.response.finish_reasons"] == ["stop", "stop"]
    assert len(_children(spans, batch, "engine generate")) == 2

    text = _text(spans)
    assert MARKER not in text and TEXT not in text
    content = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")
    assert not any(k in s.attributes for s in spans for k in content)


def test_a_failed_call_is_an_error_span(
    tmp_path: Path, model_dir: Path, receiver: OtlpReceiver
) -> None:
    """A call the gateway refuses still ends its span, with ``error.type``."""
    with fast_stack(tmp_path, model_dir, otlp_endpoint=receiver.url) as st:
        r = st.post(CHAT, {"model": "m", "messages": []})
        assert r.status_code == 400
        spans = receiver.wait_for(lambda s: len(_calls(s)) >= 1)
    (call,) = _calls(spans)
    assert call.attributes["error.type"] == "400"
    assert call.attributes["http.response.status_code"] == 400
    assert call.status == "STATUS_CODE_UNSET"  # a client error is not the server's


def test_content_on_is_redacted_as_records_are(
    tmp_path: Path, model_dir: Path, receiver: OtlpReceiver
) -> None:
    """With RLGATE_OTLP_CAPTURE_CONTENT, the messages and the answer are in the span in
    the conventions' message schema; in a project with redaction on, redacted (p1), in
    one without, as sent (p2)."""
    settings = {"otlp_endpoint": receiver.url, "otlp_capture_content": True}
    with fast_stack(tmp_path, model_dir, **settings) as st:
        db = make_engine(f"sqlite:///{tmp_path / 'rlgate.db'}")
        with transaction(session_factory(db)) as s:
            s.get(ProjectRow, "p1").settings = {"redaction": {"enabled": True}}
        db.dispose()
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"{MARKER}: write to {EMAIL}"},
        ]
        for project in ("p1", "p2"):
            r = st.post(CHAT, {"model": "m", "messages": messages}, project=project)
            assert r.status_code == 200, r.text
        spans = receiver.wait_for(lambda s: _complete(s, 2))

    calls = {c.attributes["rlgate.project"]: c.attributes for c in _calls(spans)}
    for project, a in calls.items():
        inputs = json.loads(a["gen_ai.input.messages"])
        outputs = json.loads(a["gen_ai.output.messages"])
        assert [m["role"] for m in inputs] == ["system", "user"]
        assert inputs[0]["parts"] == [{"type": "text", "content": "be brief"}]
        (part,) = inputs[1]["parts"]
        assert part["type"] == "text" and MARKER in part["content"]
        assert outputs == [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": TEXT}],
                "finish_reason": "stop",
            }
        ]
        if project == "p1":
            assert part["content"] == f"{MARKER}: write to [REDACTED:email]"
        else:
            assert part["content"] == f"{MARKER}: write to {EMAIL}"
    assert EMAIL not in json.dumps(
        [s.attributes for s in spans if s.attributes.get("rlgate.project") == "p1"]
    )


# ---- a collector that is down or silent ---------------------------------------------------


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """A port that accepts connections and never answers (the kernel completes the
    handshake; nothing reads)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def refused_collector() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


@pytest.mark.parametrize("collector", ["silent_collector", "refused_collector"])
def test_a_dead_collector_never_fails_or_holds_a_call(
    tmp_path: Path, model_dir: Path, collector: str, request: pytest.FixtureRequest
) -> None:
    endpoint = request.getfixturevalue(collector)
    with fast_stack(tmp_path, model_dir, otlp_endpoint=endpoint) as st:
        msg = [{"role": "user", "content": "hi"}]
        st.post(CHAT, {"model": "m", "messages": msg})  # warm: first render, first session
        started = time.monotonic()
        for i in range(10):
            r = st.post(CHAT, {"model": "m", "messages": msg, "stream": i % 2 == 1})
            assert r.status_code == 200, r.text
        took = time.monotonic() - started
        # the exporter waits up to 2 s per batch on this collector: had a call waited for
        # it, 10 calls would take over 20 s (they take about 1 s here)
        assert took < 15, f"10 calls took {took:.1f}s with a dead collector"
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 30  # the gateway still stops


# ---- configuration and the untraced path ---------------------------------------------------


def test_without_an_endpoint_no_opentelemetry_sdk_is_loaded() -> None:
    """The gateway's modules and a gateway built without RLGATE_OTLP_ENDPOINT import
    neither gateway.call.tracing nor OpenTelemetry's SDK or exporter (FastAPI itself imports
    the OpenTelemetry API)."""
    code = (
        "import sys\n"
        "import gateway.app, gateway.api.registry, gateway.call.pipeline, gateway.api.handler\n"
        "from core.settings import Settings\n"
        "assert gateway.app.build_tracing(Settings()) is None\n"
        "bad = [m for m in sys.modules if m == 'gateway.call.tracing' or\n"
        "       m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))]\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGATE_OTLP")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_an_endpoint_without_the_package_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.app import build_tracing

    monkeypatch.setitem(sys.modules, "gateway.call.tracing", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"rlgate\[otel\]"):
        build_tracing(Settings(otlp_endpoint="http://127.0.0.1:4318"))


def test_the_endpoint_setting() -> None:
    from gateway.call.tracing import traces_url

    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    assert Settings(otlp_endpoint=" http://c:4318 ").otlp_endpoint == "http://c:4318"
    with pytest.raises(ValueError, match="RLGATE_OTLP_ENDPOINT"):
        Settings(otlp_endpoint="collector:4318")
