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
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN, STALE_IF_DOWN_S
from core.errors import APIError
from gateway.auth import Principal
from gateway.engine_client import EngineClient
from gateway.errors import bad_request, db_down_error
from gateway.metrics import Metrics
from gateway.parsing import TOOL_PARSERS, StreamingParser, parse_output
from gateway.recorder import Recorder
from gateway.redaction import RedactionPolicy
from gateway.render_pool import RenderPool
from gateway.request import Completion, GenerationRequest, Message, ToolCallOut
from gateway.sessions import SessionContext, SessionStore, conversation_hash
from gateway.templating import ChatRenderer, check_prompt_chars
from schemas.atdp import Interaction
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow

log = logging.getLogger("rlgate.gateway")


class Leases:
    """Requests in flight per adapter name; an unload of a version waits for zero."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self._cond = asyncio.Condition()

    async def acquire(self, name: str) -> None:
        async with self._cond:
            self.counts[name] += 1

    async def release(self, name: str) -> None:
        async with self._cond:
            self.counts[name] -= 1
            if self.counts[name] <= 0:
                del self.counts[name]
            self._cond.notify_all()

    async def wait_released(self, name: str, timeout: float = 600.0) -> None:
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: self.counts.get(name, 0) == 0), timeout
            )


class ServingPolicy:
    """Which adapter serves a project now (``policy_versions.status == 'serving'``)."""

    def __init__(self, factory: sessionmaker[Session], ttl_s: float = 0.5) -> None:
        self.ttl_s = ttl_s
        self.factory = factory
        self._cache: dict[str, tuple[float, str | None]] = {}

    def invalidate(self) -> None:
        self._cache.clear()

    def cached(self, project_id: str) -> tuple[bool, str | None]:
        """(fresh, adapter) from the cache alone, for the hot path."""
        hit = self._cache.get(project_id)
        if hit and time.monotonic() - hit[0] < self.ttl_s:
            return True, hit[1]
        return False, None

    def adapter_for(self, project_id: str) -> str | None:
        now = time.monotonic()
        hit = self._cache.get(project_id)
        if hit and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            with self.factory() as db:
                name = db.scalars(
                    select(PolicyVersionRow.name)
                    .where(
                        PolicyVersionRow.project_id == project_id,
                        PolicyVersionRow.status == "serving",
                    )
                    .order_by(PolicyVersionRow.version.desc())
                    .limit(1)
                ).first()
        except DB_DOWN:  # keep serving the version last read while the database is down
            if hit and now - hit[0] < STALE_IF_DOWN_S:
                return hit[1]
            raise db_down_error() from None
        self._cache[project_id] = (now, name)
        return name


@dataclass
class Prepared:
    principal: Principal
    req: GenerationRequest
    session: SessionContext
    prompt_ids: list[int]
    adapter: str | None
    max_tokens: int
    interaction_id: str
    started: float = field(default_factory=time.monotonic)
    ttft_ms: float | None = None
    engine_url: str | None = None

    @property
    def policy_version(self) -> str:
        return self.adapter or "base"

    def row_id(self, index: int) -> str:
        return self.interaction_id if self.req.sampling.n == 1 else f"{self.interaction_id}.{index}"


@dataclass
class StreamEvent:
    index: int
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[float] = field(default_factory=list)
    new_top: list[list[tuple[int, float]]] = field(default_factory=list)
    finished: Completion | None = None


async def open_stream(pipeline: Pipeline, prep: Prepared) -> tuple[Any, StreamEvent | None]:
    """Start generating before any response byte is sent, so an engine that is down or a
    request it refuses still gets a proper HTTP error instead of a broken 200 stream.
    Returns the event stream and its first event; pass both to ``replay``."""
    for attempt in (0, 1):
        events = pipeline.stream(prep)
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


def _top(meta: dict[str, Any], start: int = 0) -> list[list[tuple[int, float]]] | None:
    tops = meta.get("output_top_logprobs")
    if not tops:
        return None
    return [[(int(t[1]), float(t[0])) for t in (pos or [])] for pos in tops[start:]]


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
        self.leases = Leases()
        self._context_checked = False
        self.redaction = redaction or RedactionPolicy(None)  # off unless configured

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

    # ---- before generation -----------------------------------------------------------

    async def prompt_ids(self, req: GenerationRequest) -> list[int]:
        """The request's prompt token ids. A prompt with more characters than the context
        can hold is refused (400) before any rendering; rendering and tokenizing run on
        the render pool (off the event loop, under its time limit: 503 past it)."""
        await self._ensure_context()
        check_prompt_chars(
            req.messages, req.tools, self.renderer.context_length, self.prompt_chars_per_token
        )
        _, ids = await self.render_pool.run(
            self.renderer.render, req.messages, req.tools, req.chat_template_kwargs
        )
        return ids

    async def prepare(self, p: Principal, req: GenerationRequest, prefix: str) -> Prepared:
        if p.kind not in ("agent", "admin"):
            raise APIError(403, f"a {p.kind} key cannot call models; use an agent key")
        self.recorder.admit()  # 503 while the recording backlog is over its cap
        ids = await self.prompt_ids(req)
        ctx_len = self.renderer.context_length
        if len(ids) >= ctx_len:
            raise bad_request(
                f"the prompt is {len(ids)} tokens but the model's context is {ctx_len} tokens; "
                "shorten the conversation, serve a policy with a longer context, or trim the "
                "client's own prompt (docs/clients/ in the rlgate repository has trimmed "
                "configurations for Claude Code, OpenClaw and Codex)",
                "messages",
            )
        room = ctx_len - len(ids)
        max_tokens = req.sampling.max_tokens or min(room, self.default_max_tokens or room)
        if len(ids) + max_tokens > ctx_len:
            raise bad_request(
                f"this model's maximum context length is {ctx_len} tokens; you requested "
                f"{len(ids) + max_tokens} ({len(ids)} in the messages, {max_tokens} for the "
                "completion); reduce max_tokens or the messages",
                "max_tokens",
            )
        agent = req.metadata.get("agent_name") if isinstance(req.metadata, dict) else None
        args = (p, req.messages, req.protocol, req.session_hint, agent)
        if self.sessions.needs_db(p, req.messages, req.session_hint):
            session = await asyncio.to_thread(self.sessions.resolve, *args)
        else:  # a fixed key's first turn: a new session, no database read, no thread hop
            session = self.sessions.resolve(*args)
        fresh, adapter = self.serving.cached(p.project_id)
        if not fresh:
            adapter = await asyncio.to_thread(self.serving.adapter_for, p.project_id)
        return Prepared(
            p, req, session, ids, adapter, max_tokens, f"{prefix}{secrets.token_hex(12)}"
        )

    def _payload(self, prep: Prepared, index: int, stream: bool) -> dict[str, Any]:
        s = prep.req.sampling
        params: dict[str, Any] = {
            "max_new_tokens": prep.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "skip_special_tokens": True,
        }
        if s.stop:
            params["stop"] = s.stop
        if s.seed is not None:
            params["seed"] = s.seed + index
        if s.json_schema is not None:
            params["json_schema"] = s.json_schema
        return {
            "input_ids": prep.prompt_ids,
            "sampling_params": params,
            "return_logprob": True,
            "top_logprobs_num": s.top_logprobs if s.logprobs else 0,
            "stream": stream,
            "rid": f"{prep.row_id(index)}-{secrets.token_hex(4)}",
            "lora_path": prep.adapter,
        }

    def _parser_name(self, prep: Prepared) -> str | None:
        if not prep.req.tools or prep.req.tool_choice == "none":
            return None
        return self.tool_parser

    def _completion(self, prep: Prepared, index: int, out: dict[str, Any]) -> Completion:
        prompt_len = len(prep.prompt_ids)
        meta = out.get("meta_info", {})
        ids = [int(i) for i in out.get("output_ids", [])]
        lps = [float(t[0]) for t in meta.get("output_token_logprobs", [])]
        if len(lps) != len(ids):
            raise APIError(503, "the engine returned logprobs that do not match its tokens")
        text = out.get("text", "")
        content, reasoning, calls = parse_output(text, self._parser_name(prep), self.reasoning)
        fr = (meta.get("finish_reason") or {}).get("type", "stop")
        if calls and fr == "stop":
            fr = "tool_calls"
        return Completion(
            index,
            ids,
            lps,
            _top(meta),
            text,
            content,
            reasoning,
            calls,
            fr,
            int(meta.get("prompt_tokens", prompt_len)),
            int(meta.get("cached_tokens", 0) or 0),
        )

    # ---- generation ------------------------------------------------------------------

    async def adapter_moved_on(self, prep: Prepared, error: BaseException) -> bool:
        """The engine refused this request's adapter because a newer version was published
        and the old one unloaded between the (cached) lookup and the call. Looks up the
        serving adapter again; True (and ``prep`` updated) if it changed, so the caller
        retries once instead of failing the agent's call."""
        if not (isinstance(error, APIError) and error.status == 400 and prep.adapter):
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
            affinity = prep.session.session_id
            results = await asyncio.gather(
                *[
                    self.engines.generate(self._payload(prep, i, False), affinity)
                    for i in range(prep.req.sampling.n)
                ]
            )
        finally:
            if prep.adapter:
                await self.leases.release(prep.adapter)
            self.metrics.in_flight.dec()
        prep.engine_url = results[0][1]
        return [self._completion(prep, i, out) for i, (out, _) in enumerate(results)]

    async def stream(self, prep: Prepared) -> AsyncIterator[StreamEvent]:
        """Token-by-token events from every choice, merged; last event per choice is final.

        If the consumer stops early (client gone), the engine requests are aborted and the
        partial choices are recorded with finish_reason ``abort``.
        """
        n = prep.req.sampling.n
        queue: asyncio.Queue[StreamEvent | BaseException | None] = asyncio.Queue()
        partial: dict[int, dict[str, Any]] = {}

        async def one(index: int) -> None:
            name = self._parser_name(prep)
            parser = StreamingParser(TOOL_PARSERS[name]() if name else None, self.reasoning)
            state = partial.setdefault(index, {"ids": [], "lps": [], "text": "", "top": []})
            last: dict[str, Any] = {}
            async with self.engines.stream(
                self._payload(prep, index, True), prep.session.session_id
            ) as (chunks, url):
                prep.engine_url = url
                async for chunk in chunks:
                    last = chunk
                    ids = chunk.get("output_ids", [])
                    meta = chunk.get("meta_info", {})
                    start = len(state["ids"])
                    new_ids = [int(i) for i in ids[start:]]
                    lps = meta.get("output_token_logprobs", [])
                    new_lps = [float(t[0]) for t in lps[start:]]
                    new_top = _top(meta, start) or []
                    text = chunk.get("text", "")
                    delta = text[len(state["text"]) :] if text.startswith(state["text"]) else ""
                    state.update(text=text)
                    state["ids"].extend(new_ids)
                    state["lps"].extend(new_lps)
                    state["top"].extend(new_top)
                    if prep.ttft_ms is None and new_ids:
                        prep.ttft_ms = (time.monotonic() - prep.started) * 1000
                    d = parser.feed(delta)
                    if d.content or d.reasoning or d.tool_calls or new_ids:
                        await queue.put(
                            StreamEvent(
                                index,
                                d.content,
                                d.reasoning,
                                d.tool_calls,
                                new_ids,
                                new_lps,
                                new_top,
                            )
                        )
            tail = parser.feed("", final=True)
            done = self._completion(
                prep, index, {**last, "output_ids": state["ids"], "text": state["text"]}
            )
            done.logprobs = state["lps"]
            done.top_logprobs = state["top"] or None
            await queue.put(
                StreamEvent(index, tail.content, tail.reasoning, tail.tool_calls, finished=done)
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
                    if not any(partial[i]["ids"] for i in partial):
                        partial.clear()  # nothing was generated: record nothing
                    raise item
                if item.finished:
                    finished[item.index] = item.finished
                yield item
        finally:
            # The consumer may be cancelled (client gone) and, under anyio, stays cancelled:
            # run the cleanup as its own task so aborting and recording always complete.
            cleanup = asyncio.ensure_future(self._end_stream(prep, tasks, finished, partial))
            await asyncio.shield(cleanup)

    async def _end_stream(
        self,
        prep: Prepared,
        tasks: list[asyncio.Task],
        finished: dict[int, Completion],
        partial: dict[int, dict],
    ) -> None:
        n = prep.req.sampling.n
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if prep.adapter:
            await self.leases.release(prep.adapter)
        self.metrics.in_flight.dec()
        if len(finished) < n and partial:  # the client went away: record what it got
            aborted = []
            for i in range(n):
                if i in finished:
                    aborted.append(finished[i])
                    continue
                st = partial.get(i, {"ids": [], "lps": [], "text": "", "top": []})
                aborted.append(
                    Completion(
                        i,
                        st["ids"],
                        st["lps"],
                        st["top"] or None,
                        st["text"],
                        st["text"],
                        None,
                        [],
                        "abort",
                        len(prep.prompt_ids),
                    )
                )
            await self.record(prep, aborted)

    # ---- after generation ------------------------------------------------------------

    async def record(self, prep: Prepared, completions: list[Completion]) -> None:
        """Durably record every choice; returns once they are safe (spool fsync)."""
        now = utcnow()
        latency = (time.monotonic() - prep.started) * 1000
        group = prep.interaction_id if len(completions) > 1 else None
        records = []
        for c in completions:
            answer = Message("assistant", c.content or "", c.tool_calls)
            cont = conversation_hash([*prep.req.messages, answer])
            rec = Interaction(
                id=prep.row_id(c.index),
                project_id=prep.principal.project_id,
                session_id=prep.session.session_id,
                seq=0,
                parent_id=prep.session.parent_id,
                group_id=group,
                choice_index=c.index,
                request=prep.req.raw,
                prompt_token_ids=prep.prompt_ids,
                completion_token_ids=c.output_ids,
                completion_logprobs=c.logprobs,
                temperature=prep.req.sampling.temperature,
                top_p=prep.req.sampling.top_p,
                policy_version=prep.policy_version,
                finish_reason=c.finish_reason,
                output={
                    "text": c.content,
                    "reasoning": c.reasoning,
                    "tool_calls": [
                        {"id": t.id, "name": t.name, "arguments": t.arguments} for t in c.tool_calls
                    ],
                },
                usage={
                    "prompt_tokens": len(prep.prompt_ids),
                    "completion_tokens": len(c.output_ids),
                    "cached_tokens": c.cached_tokens,
                },
                latency_ms=latency,
                ttft_ms=prep.ttft_ms if prep.ttft_ms is not None else latency,
                engine_url=prep.engine_url,
                created_at=now,
                continuation_hash=cont,
            )
            records.append(
                {"interaction": rec.model_dump(mode="json"), "session": prep.session.new_row}
            )
            if c.finish_reason != "abort":
                self.sessions.remember(
                    prep.principal.project_id,
                    prep.principal.key_id,
                    prep.session.session_id,
                    rec.id,
                    cont,
                )
            self.metrics.completion_tokens.inc(len(c.output_ids))
        self.metrics.prompt_tokens.inc(len(prep.prompt_ids))
        # data protection: the one place records are redacted before storage
        records = await self.redaction.apply(prep.principal.project_id, records)
        await self.recorder.record(records)
