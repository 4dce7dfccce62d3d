"""A real OTLP/HTTP traces receiver on loopback, for tests: what a collector (Jaeger,
Tempo, Phoenix, an OpenTelemetry collector) receives, decoded with the protocol's own
protobuf package (``opentelemetry-proto``: ``ExportTraceServiceRequest``).

It serves ``POST /v1/traces`` (protobuf, gzip or not), answers with an
``ExportTraceServiceResponse`` and keeps every span it got, flattened: ids as hex,
attributes as Python values."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: str  # SPAN_KIND_SERVER, SPAN_KIND_CLIENT, SPAN_KIND_INTERNAL, ...
    attributes: dict[str, Any]
    status: str  # STATUS_CODE_UNSET, STATUS_CODE_OK, STATUS_CODE_ERROR
    events: list[dict[str, Any]] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


class OtlpReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []
        self.posts: list[str] = []  # the path of each POST
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                receiver._got(self.path, body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _got(self, path: str, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=Span.SpanKind.Name(s.kind),
                            attributes={kv.key: value(kv.value) for kv in s.attributes},
                            status=Status.StatusCode.Name(s.status.code),
                            events=[
                                {
                                    "name": e.name,
                                    **{kv.key: value(kv.value) for kv in e.attributes},
                                }
                                for e in s.events
                            ],
                            resource=resource,
                            scope=ss.scope.name,
                        )
                    )
        with self._lock:
            self.posts.append(path)
            self.spans.extend(spans)

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """Every span received, once ``done`` of them is true."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = [(s.name, s.kind) for s in spans]
                raise AssertionError(f"the spans did not arrive within {timeout}s: {names}")
            time.sleep(0.02)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join(10)
