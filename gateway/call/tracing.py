"""OpenTelemetry traces of model calls, optional (``RLGATE_OTLP_ENDPOINT``).

Imported only when the operator configured an endpoint (gateway/app.py ``build_tracing``):
without one, no module of OpenTelemetry's SDK or exporter is loaded and the pipeline's
only cost is one ``is None`` test per call.

Each model call (``ApiHandler.handle``, every API) is one SERVER span under the GenAI
semantic conventions (opentelemetry semantic-conventions, docs/gen-ai/gen-ai-spans.md,
v1.37 and later: ``gen_ai.provider.name``, not the older ``gen_ai.system``), named
``{gen_ai.operation.name} {gen_ai.request.model}``, with rlgate's own ``rlgate.*``
attributes (project, session, interaction, policy version). Its children: one CLIENT span
per engine request (``engine generate``; its W3C ``traceparent`` goes to the engine) and
one INTERNAL span for the recording (``rlgate.record``: redaction, the spool append and
the wait for the commit). An incoming W3C ``traceparent`` makes the call span a child of
the caller's span; its sampled flag is honoured (the default sampler is parent-based).

Spans go through a ``BatchSpanProcessor``: ending a span only queues it, and the export
(protobuf over HTTP) runs on the processor's own thread, so a slow or dead collector never
holds a call; past the queue's bound (``OTEL_BSP_MAX_QUEUE_SIZE``) spans are dropped.
The provider is rlgate's own, never the process-global one (which would also switch on
FastAPI's native per-request telemetry).

No prompt or answer text is put in a span unless ``RLGATE_OTLP_CAPTURE_CONTENT`` is on;
then ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON text, the conventions'
message schema) are redacted with the project's redactor (gateway/recording/redaction.py) when
redaction is on for it, exactly as the stored record is.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core.errors import APIError
from gateway.call.generation import Prepared
from gateway.call.request import Completion, Message, ToolCallOut
from gateway.recording.redaction import RedactionPolicy, Redactor
from schemas import sampling_fields

SERVICE_NAME = "rlgate-gateway"
PROVIDER = "rlgate"  # gen_ai.provider.name: rlgate serves its own policy
TRACES_PATH = "/v1/traces"
# gen_ai.operation.name per API (by its ``GenerationRequest.protocol``); the rest: chat
OPERATIONS = {"openai-completions": "text_completion"}

_PROPAGATOR = TraceContextTextMapPropagator()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (``/v1/traces`` appended, as
    for ``OTEL_EXPORTER_OTLP_ENDPOINT``); a URL already ending in it is kept."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def operation_of(protocol: str) -> str:
    return OPERATIONS.get(protocol, "chat")


def _error_type(e: BaseException) -> str:
    if isinstance(e, APIError):
        return str(e.status)
    if isinstance(e, asyncio.CancelledError):
        return "cancelled"
    return type(e).__qualname__


def _fail(span: Span, e: BaseException) -> None:
    """``error.type`` on the span; its status is ERROR unless a client error (4xx)."""
    span.set_attribute("error.type", _error_type(e))
    if not (isinstance(e, APIError) and e.status < 500):
        span.set_status(Status(StatusCode.ERROR, str(e)[:300] or type(e).__name__))


class Tracing:
    """The gateway's tracer: its own provider, a batch processor and the OTLP exporter."""

    def __init__(
        self,
        endpoint: str,
        *,
        capture_content: bool = False,
        exporter: SpanExporter | None = None,
    ) -> None:
        resource = Resource.create()  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES first
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        self.url = traces_url(endpoint)
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=self.url))
        )
        self.tracer = self.provider.get_tracer("rlgate.gateway")
        self.capture_content = capture_content

    def start_call(self, headers: Mapping[str, str], operation: str) -> CallTrace:
        """The span of one model call, a child of the caller's ``traceparent`` if any."""
        parent = _PROPAGATOR.extract(headers) if "traceparent" in headers else None
        span = self.tracer.start_span(
            operation,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER},
        )
        return CallTrace(self, span, operation)

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout), then stop."""
        self.provider.shutdown()


class EngineSpan:
    """One engine request's CLIENT span; ``headers`` carry its ``traceparent``."""

    __slots__ = ("span", "headers")

    def __init__(self, call: CallTrace, index: int, payload: dict[str, Any]) -> None:
        self.span = call.tracing.tracer.start_span(
            "engine generate",
            context=call.context,
            kind=SpanKind.CLIENT,
            attributes={"rlgate.choice_index": index, "rlgate.engine.rid": payload.get("rid")},
        )
        self.headers: dict[str, str] = {}
        _PROPAGATOR.inject(self.headers, context=trace.set_span_in_context(self.span))

    def answered(self, url: str) -> None:
        parts = urlsplit(url)
        self.span.set_attribute("rlgate.engine.url", url)
        if parts.hostname:
            self.span.set_attribute("server.address", parts.hostname)
        if parts.port:
            self.span.set_attribute("server.port", parts.port)

    def __enter__(self) -> EngineSpan:
        return self

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> None:
        if e is not None:
            _fail(self.span, e)
        self.span.end()


class RecordSpan:
    """The recording's INTERNAL span: ``committed`` says whether the answer waited for
    its records' commit (False: sent first, the records wait in the spool)."""

    __slots__ = ("span",)

    def __init__(self, call: CallTrace, records: int) -> None:
        self.span = call.tracing.tracer.start_span(
            "rlgate.record",
            context=call.context,
            kind=SpanKind.INTERNAL,
            attributes={"rlgate.records": records},
        )

    def committed(self, done: bool) -> None:
        self.span.set_attribute("rlgate.committed", done)

    def __enter__(self) -> RecordSpan:
        return self

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> None:
        if e is not None:
            _fail(self.span, e)
        self.span.end()


class CallTrace:
    """What one model call puts in its span, as the call goes: the request
    (``describe``, from its first prepared prompt), each engine request (``engine``), the
    outcome (``result``, once per recorded prompt), the recording (``recording``)."""

    __slots__ = (
        "tracing",
        "span",
        "context",
        "operation",
        "described",
        "ended",
        "ids",
        "finish_reasons",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
    )

    def __init__(self, tracing: Tracing, span: Span, operation: str) -> None:
        self.tracing = tracing
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.operation = operation
        self.described = False
        self.ended = False
        self.ids: list[str] = []
        self.finish_reasons: list[str] = []
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0

    # ---- the request -------------------------------------------------------------------

    def describe(self, prep: Prepared) -> None:
        """The request's attributes; a batch of prompts (Completions) is one call: its
        first prompt describes it and every prompt's interaction id is listed."""
        self.ids.append(prep.interaction_id)
        if self.described:
            return
        self.described = True
        req, s = prep.req, prep.req.sampling
        self.operation = operation_of(req.protocol)
        self.span.update_name(f"{self.operation} {req.model}" if req.model else self.operation)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.request.model": req.model,
            "gen_ai.conversation.id": prep.session.session_id,
            "gen_ai.request.max_tokens": prep.limit.tokens,
            "gen_ai.response.id": prep.interaction_id,
            "rlgate.project": prep.principal.project_id,
            "rlgate.session.id": prep.session.session_id,
            "rlgate.interaction.id": prep.interaction_id,
            "rlgate.policy.version": prep.policy_version,
            "rlgate.api": req.protocol,
        }
        for f in sampling_fields.FIELDS:  # the table's, always or when set (row's traced)
            value = s.values.get(f.name, f.default)
            if f.trace and f.traces(value):
                attrs[f.trace] = float(value)
        if s.stop:
            attrs["gen_ai.request.stop_sequences"] = list(s.stop)
        if s.seed is not None:
            attrs["gen_ai.request.seed"] = s.seed
        if s.n != 1:
            attrs["gen_ai.request.choice.count"] = s.n
        if s.json_schema is not None:
            attrs["gen_ai.output.type"] = "json"
        if req.stream:
            attrs["gen_ai.request.stream"] = True
        if prep.attempt:
            attrs["rlgate.attempt"] = prep.attempt
        if prep.principal.key_id:
            attrs["rlgate.key.id"] = prep.principal.key_id
        self.span.set_attributes(attrs)

    # ---- generation ----------------------------------------------------------------------

    def engine(self, index: int, payload: dict[str, Any]) -> EngineSpan:
        """The span of one engine request (choice ``index``), a child of the call's."""
        return EngineSpan(self, index, payload)

    def recording(self, records: int) -> RecordSpan:
        """The span of the recording (redaction, spool, commit wait), a child of the call's."""
        return RecordSpan(self, records)

    # ---- the outcome ---------------------------------------------------------------------

    def result(self, prep: Prepared, completions: list[Completion]) -> None:
        """One prompt's finished choices: finish reasons, token usage, time to first chunk."""
        if self.ended:
            return
        self.finish_reasons.extend(c.finish_reason for c in completions)
        self.input_tokens += len(prep.prompt_ids)
        self.output_tokens += sum(len(c.output_ids) for c in completions)
        if completions:
            self.cached_tokens += completions[0].cached_tokens
        attrs: dict[str, Any] = {
            "gen_ai.response.finish_reasons": self.finish_reasons,
            "gen_ai.usage.input_tokens": self.input_tokens,
            "gen_ai.usage.output_tokens": self.output_tokens,
        }
        if self.cached_tokens:
            attrs["gen_ai.usage.cache_read.input_tokens"] = self.cached_tokens
        if prep.req.stream and prep.ttft_ms is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = prep.ttft_ms / 1000
        if len(self.ids) > 1:
            attrs["rlgate.interaction.ids"] = self.ids
        if prep.req.sampling.n > 1:
            attrs["rlgate.row.ids"] = [
                prep.row_id(c.index) for c in completions
            ]  # the stored rows: <interaction id>.<choice>
        self.span.set_attributes(attrs)

    async def capture(
        self, calls: list[tuple[Prepared, list[Completion]]], redaction: RedactionPolicy
    ) -> None:
        """With content capture on: the calls' messages and answers, redacted with the
        project's redactor when redaction is on for it."""
        if self.ended or not calls:
            return
        redactor = await redaction.redactor(calls[0][0].principal.project_id)
        attrs = await asyncio.to_thread(_content, calls, redactor)
        if not self.ended:
            self.span.set_attributes(attrs)

    def fail(self, e: BaseException) -> None:
        if not self.ended:
            _fail(self.span, e)

    def status(self, code: int) -> None:
        if not self.ended:
            self.span.set_attribute("http.response.status_code", code)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.span.end()


# ---- content (opt-in) --------------------------------------------------------------------


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a custom tool's free-form input, or JSON cut by the output limit


def _call_part(t: ToolCallOut) -> dict[str, Any]:
    return {"type": "tool_call", "id": t.id, "name": t.name, "arguments": _arguments(t.arguments)}


def _message(m: Message) -> dict[str, Any]:
    """A message in the conventions' ChatMessage schema (gen-ai-input-messages.json)."""
    parts: list[dict[str, Any]] = []
    if m.role == "tool":
        parts.append({"type": "tool_call_response", "id": m.tool_call_id, "response": m.content})
    else:
        if m.reasoning:
            parts.append({"type": "reasoning", "content": m.reasoning})
        if m.content:
            parts.append({"type": "text", "content": m.content})
        parts.extend(_call_part(t) for t in m.tool_calls)
    out: dict[str, Any] = {"role": m.role, "parts": parts}
    if m.name:
        out["name"] = m.name
    return out


def _answer(c: Completion) -> dict[str, Any]:
    """A choice in the conventions' OutputMessage schema (gen-ai-output-messages.json)."""
    parts: list[dict[str, Any]] = []
    if c.reasoning:
        parts.append({"type": "reasoning", "content": c.reasoning})
    if c.content:
        parts.append({"type": "text", "content": c.content})
    parts.extend(_call_part(t) for t in c.tool_calls)
    return {"role": "assistant", "parts": parts, "finish_reason": c.finish_reason}


def _content(
    calls: list[tuple[Prepared, list[Completion]]], redactor: Redactor | None
) -> dict[str, str]:
    """``gen_ai.input.messages`` and ``gen_ai.output.messages`` as JSON text (a batch of
    prompts: every prompt's messages in order, then every choice of every prompt)."""
    inputs = [_message(m) for prep, _ in calls for m in prep.req.messages]
    outputs = [_answer(c) for _, cs in calls for c in cs]
    if redactor is not None:
        counts: Counter[str] = Counter()
        inputs = redactor.value(inputs, counts)
        outputs = redactor.value(outputs, counts)
    return {
        "gen_ai.input.messages": json.dumps(inputs, ensure_ascii=False),
        "gen_ai.output.messages": json.dumps(outputs, ensure_ascii=False),
    }
