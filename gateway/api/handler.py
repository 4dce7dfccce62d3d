"""The one way a model call is served (as SGLang's ``OpenAIServingBase`` and vLLM's serving
classes): a route hands its request to ``ApiHandler.handle``, which runs

    open the call (caller, JSON body) -> to_internal (the API's validation and translation)
    -> prepare (the pipeline: prompt rendered and tokenized once, output limit, session,
    adapter) -> generate and answer: JSON of the recorded choices, or a stream driven
    through the API's ``StreamWriter`` (``write_stream``).

Each API subclasses ``ApiHandler`` in its ``router.py`` and fills the hooks: ``to_internal``,
``body``, ``writer`` and, if it keeps something once a call is recorded, ``recorded``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core.errors import APIError
from gateway.call.pipeline import Pipeline, Prepared, StreamEvent
from gateway.call.request import Completion, GenerationRequest
from gateway.edge.auth import Principal
from gateway.edge.client_agent import agent_of
from gateway.recording.retries import client_attempt
from gateway.routes.request_context import gw_of, headers_for, principal, read_json
from gateway.state import Gateway

Hook = Callable[[list[Completion]], None]
log = logging.getLogger("rlgate.gateway")


class StreamWriter(Protocol):
    """One API's server-sent events for one stream (``write_stream`` drives it)."""

    def start(self) -> list[bytes]: ...

    def event(self, ev: StreamEvent) -> list[bytes]: ...

    def error(self, e: APIError) -> list[bytes]: ...

    def close(self, finished: list[Completion]) -> list[bytes]:
        """The last bytes before the record is made durable."""
        ...

    def end(self, finished: list[Completion]) -> list[bytes]:
        """The stream's end, sent once the record is durable."""
        ...


async def open_stream(
    pipeline: Pipeline, prep: Prepared, keep_partial: bool = True
) -> tuple[Any, StreamEvent | None]:
    """Start generating before any response byte is sent, so an engine that is down or a
    request it refuses still gets a proper HTTP error instead of a broken 200 stream.
    Returns the event stream and its first event; pass both to ``replay``.
    ``keep_partial=False``: a stream the client leaves records nothing (one prompt of a
    batch, which is recorded whole or not at all)."""
    for attempt in (0, 1):
        events = pipeline.stream(prep, keep_partial)
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            return events, None
        except BaseException as e:
            await events.aclose()
            if attempt == 0 and await pipeline.adapter_moved_on(prep, e):
                continue  # nothing was generated or sent: retry on the new version
            raise
        return events, first
    raise AssertionError("unreachable")


async def replay(first: StreamEvent | None, events: Any) -> AsyncIterator[StreamEvent]:
    """The first event again, then the rest; closing this closes ``events`` (which aborts
    the engine requests and records what the client got)."""
    async with contextlib.aclosing(events):
        if first is not None:
            yield first
        async for ev in events:
            yield ev


async def write_stream(
    pipeline: Any,
    prep: Prepared,
    events: Any,
    first: StreamEvent | None,
    writer: StreamWriter,
    on_recorded: Hook | None = None,
) -> AsyncIterator[bytes]:
    """The body of a stream: the writer's bytes for each event; after the last event, the
    pipeline records the choices (``Pipeline.finish_stream``, then ``on_recorded``) before
    the writer's end is sent. Any failure after the first byte (the engine died
    mid-stream, the record could not be made) ends the stream with the writer's error
    event in the client's own format and its terminator (``stream_failure``); what was
    generated is recorded as ``abort`` by the pipeline."""
    for chunk in writer.start():
        yield chunk
    finished: list[Completion] = []
    try:
        async with contextlib.aclosing(replay(first, events)) as evs:
            async for ev in evs:
                for chunk in writer.event(ev):
                    yield chunk
                if ev.finished:
                    finished.append(ev.finished)
        finished.sort(key=lambda c: c.index)
        for chunk in writer.close(finished):
            yield chunk
        if not finished:  # pragma: no cover - the pipeline always ends with a final event
            return
        await pipeline.finish_stream(prep, finished, on_recorded)
    except Exception as e:  # noqa: BLE001 - every failure ends the stream in its format
        if prep.trace is not None:
            prep.trace.fail(e)
        for chunk in writer.error(stream_failure(e)):
            yield chunk
        return
    for chunk in writer.end(finished):
        yield chunk


def stream_failure(e: Exception) -> APIError:
    """The error that ends a stream failing after its first byte: an APIError as it is
    (the engine client names a broken engine stream one, a 503); anything else is a 500
    that says so, and is logged with its traceback."""
    if isinstance(e, APIError):
        return e
    log.error("a stream failed after it began", exc_info=e)
    return APIError(500, f"the gateway failed mid-stream ({e.__class__.__name__}); retry")


async def _ending(body: Any, trace: Any) -> AsyncIterator[Any]:
    """A stream's body that ends the call's span when it ends (or the client leaves)."""
    try:
        async with contextlib.aclosing(body):
            async for chunk in body:
                yield chunk
    except BaseException as e:
        trace.fail(e)
        raise
    finally:
        trace.end()


@dataclass
class Call:
    """One model call as a handler sees it: the gateway, the caller and the JSON body."""

    request: Request
    gw: Gateway
    principal: Principal
    body: Any

    @property
    def model(self) -> str:
        return self.gw.settings.served_model_name


async def open_call(request: Request) -> Call:
    """The gateway, the caller (401 without a valid key) and the JSON body (400)."""
    gw = gw_of(request)
    p = await principal(request)
    return Call(request, gw, p, await read_json(request))


class ApiHandler:
    """One API's model calls. ``handle`` is the whole route; a subclass gives its
    interaction id prefix, whether a client's output limit is an upper bound
    (``FIT_MAX_TOKENS``, gateway/call/output_limit.py) and the hooks."""

    ID_PREFIX: ClassVar[str]
    FIT_MAX_TOKENS: ClassVar[bool] = False
    OPERATION: ClassVar[str] = "chat"  # its calls' gen_ai.operation.name (gateway/call/tracing.py)

    trace: Any = None  # the call's span (gateway/call/tracing.py CallTrace) when traces are on

    def __init__(self, call: Call) -> None:
        self.call = call
        self.pipeline: Pipeline = call.gw.pipeline
        self.tokenizer = call.gw.tokenizer
        self.model = call.model

    @classmethod
    async def handle(cls, request: Request) -> Response:
        tracing = gw_of(request).pipeline.tracing
        if tracing is not None:
            return await cls._traced(request, tracing.start_call(request.headers, cls.OPERATION))
        handler = cls(await open_call(request))
        return await handler.answer(await handler.prepare_all(await handler.to_internal()))

    @classmethod
    async def _traced(cls, request: Request, trace: Any) -> Response:
        """``handle`` inside the call's span, which ends with the answer (a stream's: once
        its body is sent, or the client leaves)."""
        try:
            handler = cls(await open_call(request))
            handler.trace = trace
            response = await handler.answer(await handler.prepare_all(await handler.to_internal()))
        except BaseException as e:
            if isinstance(e, Exception):  # not a cancellation: the client gets an error
                trace.status(e.status if isinstance(e, APIError) else 500)
            trace.fail(e)
            trace.end()
            raise
        trace.status(response.status_code)
        if isinstance(response, StreamingResponse):
            response.body_iterator = _ending(response.body_iterator, trace)
        else:
            trace.end()
        return response

    async def prepare_all(self, reqs: list[GenerationRequest]) -> list[Prepared]:
        """Every request prepared before any is generated."""
        return [await self.prepare(r) for r in reqs]

    async def prepare(self, req: GenerationRequest) -> Prepared:
        prep = await self.pipeline.prepare(
            self.call.principal,
            req,
            self.ID_PREFIX,
            fit_max_tokens=self.FIT_MAX_TOKENS,
            client_agent=agent_of(self.call.request.headers),
        )
        prep.attempt = client_attempt(self.call.request.headers)
        if self.trace is not None:
            prep.trace = self.trace
            self.trace.describe(prep)
        return prep

    # ---- the hooks ---------------------------------------------------------------------

    async def to_internal(self) -> list[GenerationRequest]:
        """The call's body validated and translated: one request (several only for the
        Completions API's prompts)."""
        raise NotImplementedError

    def body(self, prep: Prepared, completions: list[Completion]) -> dict[str, Any]:
        """The JSON answer of the recorded choices."""
        raise NotImplementedError

    def writer(self, prep: Prepared) -> StreamWriter:
        """The stream's events, for ``stream: true``."""
        raise NotImplementedError

    def recorded(self, prep: Prepared) -> Hook | None:
        """Run once the choices are recorded, before the answer ends (None: nothing)."""
        return None

    # ---- the answer --------------------------------------------------------------------

    async def answer(self, preps: list[Prepared]) -> Response:
        """``body`` of the recorded choices as JSON, or for a stream the events of
        ``writer``. Generation starts before any byte is sent, so an engine that is down
        still gets a proper HTTP error."""
        (prep,) = preps
        hook = self.recorded(prep)
        if prep.req.stream:
            events, first = await open_stream(self.pipeline, prep)
            return StreamingResponse(
                write_stream(self.pipeline, prep, events, first, self.writer(prep), hook),
                media_type="text/event-stream",
                headers={**headers_for(prep), "Cache-Control": "no-cache"},
            )
        completions = await self.pipeline.complete(prep, hook)
        return JSONResponse(self.body(prep, completions), headers=headers_for(prep))

    def session_header(self) -> str | None:
        """The client's session id header (``X-Session-Id``)."""
        return self.call.request.headers.get("x-session-id")
