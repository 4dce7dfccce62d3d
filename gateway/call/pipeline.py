"""The pipeline every client API shares: session -> prompt ids -> engine -> parse -> record.

Route modules translate their API into a ``GenerationRequest`` and the results back;
everything token-exact, durable or session-related happens here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from core import engine_protocol as proto
from core.errors import APIError
from gateway.call.custom_tools import custom_names
from gateway.call.forced_tools import tool_grammar
from gateway.call.generation import (
    Prepared,
    StreamEvent,
    aborted_completion,
    engine_completion,
    engine_payload,
    interaction_record,
    is_cut_forced,
    keep_streamed_ids,
)
from gateway.call.output_limit import output_limit
from gateway.call.parsing import TOOL_PARSERS, StreamDelta, StreamingParser
from gateway.call.render_pool import RenderPool
from gateway.call.request import Completion, GenerationRequest
from gateway.call.sessions import SessionStore
from gateway.call.templating import ChatRenderer, check_prompt_chars
from gateway.edge.auth import Principal, require_model_key
from gateway.edge.metrics import Metrics
from gateway.engines.adapter_leases import Leases
from gateway.engines.engine_client import AdapterNotLoaded, EngineClient
from gateway.engines.serving_cache import ServingPolicy
from gateway.recording.recorder import Recorder
from gateway.recording.redaction import RedactionPolicy
from schemas.coltypes import utcnow

if TYPE_CHECKING:  # imported only when traces are configured (gateway/app.py)
    from gateway.call.tracing import Tracing

__all__ = ["Pipeline", "Prepared", "StreamEvent"]

log = logging.getLogger("rlgate.gateway")
_UNTRACED = contextlib.nullcontext()  # the engine span's stand-in when traces are off


class Pipeline:
    def __init__(
        self,
        *,
        renderer: ChatRenderer,
        engines: EngineClient,
        sessions: SessionStore,
        recorder: Recorder,
        serving: ServingPolicy,
        metrics: Metrics,
        tool_parser: str | None = "hermes",
        reasoning_parser: bool = False,
        default_max_tokens: int | None = None,
        render_pool: RenderPool | None = None,
        prompt_chars_per_token: float = 16.0,
        redaction: RedactionPolicy | None = None,
        commit_wait_s: float = 5.0,
        leases: Leases | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.renderer = renderer
        self.render_pool = render_pool or RenderPool()
        self.prompt_chars_per_token = prompt_chars_per_token
        self.engines = engines
        self.sessions = sessions
        self.recorder = recorder
        self.serving = serving
        self.metrics = metrics
        self.tool_parser = tool_parser
        self.reasoning = reasoning_parser
        self.default_max_tokens = default_max_tokens
        self.leases = leases or Leases()  # read by the adapter sync and background unloads
        self._context_checked = False
        self.redaction = redaction or RedactionPolicy(None)  # off unless configured
        self.commit_wait_s = commit_wait_s
        self.tracing = tracing  # OpenTelemetry spans of calls (gateway/call/tracing.py); None: off

    async def _ensure_context(self) -> None:
        """Use the engines' own context length (SGLang's /get_server_info) once known."""
        if self._context_checked:
            return
        info = await self.engines.server_info()
        if info and info.get("context_length"):
            self.renderer.context_length = min(
                self.renderer.context_length, int(info["context_length"])
            )
            self._context_checked = True

    async def context_length(self) -> int:
        """The tokens prompt and answer share: the model's, or the engines' own if smaller
        (what `/v1/models` reports)."""
        await self._ensure_context()
        return self.renderer.context_length

    # ---- before generation -----------------------------------------------------------

    async def prompt_ids(self, req: GenerationRequest) -> list[int]:
        """The request's prompt token ids. A prompt with more characters than the context
        can hold is refused (400) before any rendering; rendering and tokenizing run on
        the render pool (off the event loop, under its time limit: 503 past it)."""
        await self._ensure_context()
        check_prompt_chars(
            req.messages, req.tools, self.renderer.context_length, self.prompt_chars_per_token
        )
        if req.raw_prompt is not None:  # the Completions API: no chat template
            return await self.render_pool.run(self.renderer.raw_prompt, req.raw_prompt)
        _, ids = await self.render_pool.run(
            self.renderer.render, req.messages, req.tools, req.chat_template_kwargs
        )
        return ids

    async def prepare(
        self,
        p: Principal,
        req: GenerationRequest,
        prefix: str,
        *,
        fit_max_tokens: bool = False,
        client_agent: str | None = None,
    ) -> Prepared:
        """The call made ready to generate: its prompt rendered and tokenized (once), its
        output limit (``output_limit``; ``fit_max_tokens``: the client's limit is an upper
        bound), its session and the serving adapter. A new session's agent is the call's
        ``metadata.agent_name``, else ``client_agent`` (gateway/edge/client_agent.py: from the
        client's headers)."""
        require_model_key(p)
        forced = None
        if req.tools:  # grammars a request's tools drive: checked, converted off the loop
            forced = await self.render_pool.run(
                tool_grammar, req, self.tool_parser, what="reading the tools' grammars"
            )
        self.recorder.admit()  # 503 while the recording backlog is over its cap
        ids = await self.prompt_ids(req)
        limit = output_limit(
            req.sampling.max_tokens,
            len(ids),
            self.renderer.context_length,
            self.default_max_tokens,
            fit=fit_max_tokens,
            where="messages" if req.raw_prompt is None else "prompt",
        )
        agent = req.metadata.get("agent_name") if isinstance(req.metadata, dict) else None
        agent = agent or client_agent
        args = (p, req.messages, req.protocol, req.session_hint, agent)
        if self.sessions.needs_db(p, req.messages, req.session_hint):
            session = await asyncio.to_thread(self.sessions.resolve, *args)
        else:  # a fixed key's first turn: a new session, no database read, no thread hop
            session = self.sessions.resolve(*args)
        fresh, adapter = self.serving.cached(p.project_id)
        if not fresh:
            adapter = await asyncio.to_thread(self.serving.adapter_for, p.project_id)
        return Prepared(
            principal=p,
            req=req,
            session=session,
            prompt_ids=ids,
            adapter=adapter,
            limit=limit,
            interaction_id=f"{prefix}{secrets.token_hex(12)}",
            forced_tools=forced,
        )

    def _parser_name(self, prep: Prepared) -> str | None:
        if not prep.req.tools or prep.req.tool_choice == "none":
            return None
        return self.tool_parser

    def _reasoning(self, prep: Prepared) -> bool:
        """A raw prompt's answer is text as the model wrote it: no reasoning split."""
        return self.reasoning and prep.req.raw_prompt is None

    def _completion(self, prep: Prepared, index: int, out: dict[str, Any]) -> Completion:
        return engine_completion(prep, index, out, self._parser_name(prep), self._reasoning(prep))

    # ---- generation ------------------------------------------------------------------

    async def adapter_moved_on(self, prep: Prepared, error: BaseException) -> bool:
        """The engine refused this request's adapter because a newer version was published
        and the old one unloaded between the (cached) lookup and the call. Looks up the
        serving adapter again; True (and ``prep`` updated) if it changed, so the caller
        retries once instead of failing the agent's call."""
        refused = isinstance(error, AdapterNotLoaded) or (
            isinstance(error, APIError) and error.status == 400
        )
        if not (refused and prep.adapter):
            return False
        self.serving.invalidate()
        now = await asyncio.to_thread(self.serving.adapter_for, prep.principal.project_id)
        if now == prep.adapter:
            return False
        log.info("adapter %s was replaced by %s mid-request: retrying", prep.adapter, now)
        prep.adapter = now
        return True

    async def run(self, prep: Prepared) -> list[Completion]:
        try:
            return await self._run_once(prep)
        except APIError as e:
            if not await self.adapter_moved_on(prep, e):
                raise
        return await self._run_once(prep)

    async def _run_once(self, prep: Prepared) -> list[Completion]:
        self.metrics.in_flight.inc()
        if prep.adapter:
            await self.leases.acquire(prep.adapter)
        try:
            affinity, project = prep.session.session_id, prep.principal.project_id
            results = await asyncio.gather(
                *[
                    self.engines.generate(engine_payload(prep, i, False), affinity, project)
                    if prep.trace is None
                    else self._traced_generate(prep, i)
                    for i in range(prep.req.sampling.n)
                ]
            )
        finally:
            if prep.adapter:
                await self.leases.release(prep.adapter)
            self.metrics.in_flight.dec()
        prep.engine_url = results[0][1]
        return [self._completion(prep, i, out) for i, (out, _) in enumerate(results)]

    async def _traced_generate(self, prep: Prepared, index: int) -> tuple[Any, str]:
        """``engines.generate`` of choice ``index`` in its engine span (traceparent sent)."""
        payload = engine_payload(prep, index, False)
        with prep.trace.engine(index, payload) as span:
            affinity, project = prep.session.session_id, prep.principal.project_id
            out, url = await self.engines.generate(payload, affinity, project, span.headers)
            span.answered(url)
        return out, url

    async def stream(self, prep: Prepared, keep_partial: bool = True) -> AsyncIterator[StreamEvent]:
        """Token-by-token events from every choice, merged; last event per choice is final.

        If the consumer stops early (client gone), the engine requests are aborted and,
        with ``keep_partial``, the partial choices are recorded with finish_reason
        ``abort`` (a batch of prompts records all or nothing: the Completions API's
        ``prompt_batch.py``).
        """
        n = prep.req.sampling.n
        queue: asyncio.Queue[StreamEvent | BaseException | None] = asyncio.Queue()
        partial: dict[int, proto.StreamReader] = {}

        async def one(index: int) -> None:
            name = self._parser_name(prep)
            tp = TOOL_PARSERS[name](custom_names(prep.req.tools)) if name else None
            parser = StreamingParser(tp, self._reasoning(prep))
            reader = proto.StreamReader()
            partial[index] = reader
            prompt_pending = prep.req.prompt_logprobs
            payload = engine_payload(prep, index, True)
            span = prep.trace.engine(index, payload) if prep.trace is not None else None
            with span or _UNTRACED:
                async with self.engines.stream(
                    payload,
                    prep.session.session_id,
                    prep.principal.project_id,
                    headers=span.headers if span is not None else None,
                ) as (chunks, url):
                    prep.engine_url = url
                    if span is not None:
                        span.answered(url)
                    async for chunk in chunks:
                        new = reader.feed(chunk)
                        if prep.ttft_ms is None and new.ids:
                            prep.ttft_ms = (time.monotonic() - prep.started) * 1000
                        d = parser.feed(new.text)
                        if d.content or d.reasoning or d.tool_calls or new.ids or new.text:
                            prompt = {}
                            if prompt_pending:
                                meta = chunk.get("meta_info") or {}
                                prompt = proto.prompt_logprobs_of(meta)
                                prompt_pending = False
                            await queue.put(
                                StreamEvent(
                                    index=index,
                                    text=new.text,
                                    content=d.content,
                                    reasoning=d.reasoning,
                                    tool_calls=d.tool_calls,
                                    new_ids=new.ids,
                                    new_logprobs=new.logprobs,
                                    new_top=new.top,
                                    **prompt,
                                )
                            )
            done = self._completion(prep, index, reader.output())
            if is_cut_forced(prep, done.finish_reason):  # the cut call, never its markup
                tail = StreamDelta(tool_calls=done.tool_calls[len(parser.calls) :])
            else:
                tail = parser.feed("", final=True)
            keep_streamed_ids(done, parser.calls)
            await queue.put(
                StreamEvent(
                    index=index,
                    content=tail.content,
                    reasoning=tail.reasoning,
                    tool_calls=tail.tool_calls,
                    finished=done,
                )
            )

        async def runner(index: int) -> None:
            try:
                await one(index)
            except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
                await queue.put(e)
                return
            await queue.put(None)

        self.metrics.in_flight.inc()
        if prep.adapter:
            await self.leases.acquire(prep.adapter)
        tasks = [asyncio.create_task(runner(i)) for i in range(n)]
        finished: dict[int, Completion] = {}
        try:
            remaining = n
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                    continue
                if isinstance(item, BaseException):
                    if not any(partial[i].ids for i in partial):
                        partial.clear()  # nothing was generated: record nothing
                    raise item
                if item.finished:
                    finished[item.index] = item.finished
                yield item
        finally:
            # The consumer may be cancelled (client gone) and, under anyio, stays cancelled:
            # run the cleanup as its own task so aborting and recording always complete.
            if not keep_partial:
                partial.clear()
            cleanup = asyncio.ensure_future(self._end_stream(prep, tasks, finished, partial))
            await asyncio.shield(cleanup)

    async def _end_stream(
        self,
        prep: Prepared,
        tasks: list[asyncio.Task],
        finished: dict[int, Completion],
        partial: dict[int, proto.StreamReader],
    ) -> None:
        n = prep.req.sampling.n
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if prep.adapter:
            await self.leases.release(prep.adapter)
        self.metrics.in_flight.dec()
        if len(finished) < n and partial:  # the client went away: record what it got
            aborted = [
                finished[i]
                if i in finished
                else aborted_completion(prep, i, partial.get(i) or proto.StreamReader())
                for i in range(n)
            ]
            await self.record(prep, aborted, answer=False)

    # ---- after generation ------------------------------------------------------------

    async def complete(
        self, prep: Prepared, on_recorded: Callable[[list[Completion]], None] | None = None
    ) -> list[Completion]:
        """A call without streaming: generate every choice, record them, then the hook."""
        completions = await self.run(prep)
        await self.record(prep, completions)
        if on_recorded is not None:
            on_recorded(completions)
        return completions

    async def finish_stream(
        self,
        prep: Prepared,
        finished: list[Completion],
        on_recorded: Callable[[list[Completion]], None] | None = None,
    ) -> None:
        """The hook for a stream's last event: record its choices, then ``on_recorded``;
        the API's translator sends the stream's end only after this returns."""
        await self.record(prep, finished)
        if on_recorded is not None:
            on_recorded(finished)

    async def record(
        self, prep: Prepared, completions: list[Completion], answer: bool = True
    ) -> None:
        """``record_many`` of one call's choices."""
        await self.record_many([(prep, completions)], answer)

    def _records(self, prep: Prepared, completions: list[Completion]) -> list[dict[str, Any]]:
        now = utcnow()
        latency = (time.monotonic() - prep.started) * 1000
        group = prep.interaction_id if len(completions) > 1 else None
        records = []
        for c in completions:
            rec = interaction_record(prep, c, now=now, latency_ms=latency, group=group)
            records.append(
                {"interaction": rec.model_dump(mode="json"), "session": prep.session.new_row}
            )
            if c.finish_reason != "abort":
                self.sessions.remember(
                    prep.principal.project_id,
                    prep.principal.key_id,
                    prep.session.session_id,
                    rec.id,
                    rec.continuation_hash,
                )
            self.metrics.completion_tokens.inc(len(c.output_ids))
        self.metrics.prompt_tokens.inc(len(prep.prompt_ids))
        return records

    async def record_many(
        self, calls: list[tuple[Prepared, list[Completion]]], answer: bool = True
    ) -> None:
        """Durably record every choice of ``calls`` as one unit (one ``record()``: one
        transaction); returns once they are safe (in the spool) and, for an ``answer``
        still to be sent, committed: every id it names is then readable on every replica
        (bounded by ``commit_wait_s``, never held while the database is unreachable).
        Called for a finished call or stream, an aborted stream (``answer=False``: the
        client is gone) and a batch of prompts (gateway.api.openai_completions.prompt_batch).
        A call that generates nothing (``max_tokens: 0``: Completions' ``echo`` scoring a
        prompt) is not recorded: there is no model turn, nothing to train on.
        With traces on, the call's span gets the outcome and the recording its own span."""
        trace = calls[0][0].trace if calls else None
        if trace is not None:
            for prep, cs in calls:
                trace.result(prep, cs)
        calls = [(prep, cs) for prep, cs in calls if prep.limit.tokens > 0]
        if not calls:
            return
        if trace is None:
            await self._record_many(calls, answer)
            return
        if trace.tracing.capture_content:
            await trace.capture(calls, self.redaction)
        with trace.recording(sum(len(cs) for _, cs in calls)) as span:
            span.committed(await self._record_many(calls, answer))

    async def _record_many(
        self, calls: list[tuple[Prepared, list[Completion]]], answer: bool
    ) -> bool:
        """``record_many`` of calls to record; True once committed (when waited for)."""
        records = [r for prep, cs in calls for r in self._records(prep, cs)]
        prep = calls[0][0]
        # data protection: the one place records are redacted before storage
        records = await self.redaction.apply(prep.principal.project_id, records)
        ticket = await self.recorder.record(records)
        if not answer or self.commit_wait_s <= 0:
            return False
        if await ticket.wait(self.commit_wait_s) is None:
            log.warning(
                "answered %s before its record was committed: the database took over %gs "
                "(RLGATE_COMMIT_WAIT_S); the record is in the spool and is written when the "
                "database takes it, so its ids may 404 on another gateway until then",
                prep.interaction_id,
                self.commit_wait_s,
            )
            return False
        return True
