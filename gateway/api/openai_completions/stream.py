"""OpenAI Completions streaming: ``text_completion`` chunks, usage if asked, ``[DONE]``.

One stream for every prompt of the call: choice ``k * n + j`` is choice j of prompt k (as
vLLM numbers them, and as the answer without streaming does)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from core.errors import APIError
from gateway.api.base import token_ids
from gateway.api.handler import stream_failure
from gateway.api.openai_chat.stream import OpenAIStream
from gateway.api.openai_completions import prompt_batch
from gateway.api.openai_completions.protocol import choice_json
from gateway.api.openai_completions.translator import echoed, logprobs_json
from gateway.call.pipeline import Pipeline, Prepared, StreamEvent
from gateway.call.request import Completion


class CompletionStream(OpenAIStream):
    """The chunks of one call: with ``echo`` (or ``return_token_ids``) a first chunk per
    choice with the prompt (its ids; with ``logprobs``, its logprobs too, sent with the
    choice's first event, which brings them); then the text as it comes, each chunk with
    its logprobs (character offsets running on) and its ids if asked; a finish chunk per
    choice; usage of every prompt (if asked for) and ``[DONE]`` once the batch is
    durable. The id is the first prompt's interaction id."""

    def __init__(self, preps: list[Prepared], tokenizer: Any, model: str) -> None:
        super().__init__(preps[0], "text_completion", model)
        self.preps = preps
        self.tokenizer = tokenizer
        self.n = preps[0].req.sampling.n
        echo = bool(preps[0].req.raw.get("echo"))
        self.prefix = [echoed(p, tokenizer) if echo else "" for p in preps]
        self.offset = [[len(pre)] * self.n for pre in self.prefix]
        self.echo_pending = {
            (k, j) for k, p in enumerate(preps) if p.req.prompt_logprobs for j in range(self.n)
        }

    def _head(self, k: int, j: int, logprobs: dict[str, Any] | None = None) -> bytes:
        choice = choice_json(k * self.n + j, self.prefix[k], logprobs, None)
        return self._chunk({**choice, **token_ids(self.preps[k])})

    def start(self) -> list[bytes]:
        out = []
        for k, prep in enumerate(self.preps):
            if prep.req.prompt_logprobs or not (self.prefix[k] or prep.req.return_token_ids):
                continue
            out += [self._head(k, j) for j in range(self.n)]
        return out

    def _echo(self, k: int, ev: StreamEvent) -> list[bytes]:
        """The echoed prompt with its logprobs, on choice ``ev.index``'s first event."""
        if (k, ev.index) not in self.echo_pending:
            return []
        self.echo_pending.discard((k, ev.index))
        got = ev.finished or ev
        ids = self.preps[k].prompt_ids
        if got.prompt_logprobs is None or len(got.prompt_logprobs) != len(ids):
            raise APIError(503, "the engine did not return the prompt's logprobs; retry")
        top = got.prompt_top or [None] * len(ids)
        lps = logprobs_json(self.tokenizer, ids, got.prompt_logprobs, top)
        return [self._head(k, ev.index, lps)]

    def event(self, k: int, ev: StreamEvent) -> list[bytes]:
        """An event of prompt ``k``'s choice ``ev.index``."""
        prep, index = self.preps[k], k * self.n + ev.index
        out = self._echo(k, ev)
        if ev.text or ev.new_ids:
            logprobs = None
            if prep.req.sampling.logprobs:
                start = self.offset[k][ev.index]
                logprobs = logprobs_json(
                    self.tokenizer, ev.new_ids, ev.new_logprobs, ev.new_top or None, start
                )
                self.offset[k][ev.index] = start + sum(len(t) for t in logprobs["tokens"])
            choice = choice_json(index, ev.text, logprobs, None)
            if prep.req.return_token_ids:
                choice["token_ids"] = ev.new_ids
            out.append(self._chunk(choice))
        if ev.finished:
            out.append(self._chunk(choice_json(index, "", None, ev.finished.finish_reason)))
        return out

    def end(self, finished: list[list[Completion]]) -> list[bytes]:
        calls = [(len(p.prompt_ids), cs) for p, cs in zip(self.preps, finished, strict=True)]
        return self.tail(self.preps[0].req.include_usage, calls)


async def body(
    pipeline: Pipeline, opened: list[prompt_batch.Opened], writer: CompletionStream
) -> AsyncIterator[bytes]:
    """The stream of every prompt's events; once all are finished, the batch is recorded
    as one unit (``record_many``) before usage and ``[DONE]`` are sent. Any failure ends
    the stream with an error chunk and ``[DONE]`` (handler.py ``stream_failure``); one
    prompt's partial answer is recorded as ``abort``, nothing of a batch of prompts."""
    for chunk in writer.start():
        yield chunk
    finished: list[list[Completion]] = [[] for _ in writer.preps]
    try:
        async with contextlib.aclosing(prompt_batch.merged(opened)) as events:
            async for k, ev in events:
                for chunk in writer.event(k, ev):
                    yield chunk
                if ev.finished:
                    finished[k].append(ev.finished)
        for cs in finished:
            cs.sort(key=lambda c: c.index)
        await pipeline.record_many(list(zip(writer.preps, finished, strict=True)))
    except Exception as e:  # noqa: BLE001 - every failure ends the stream in its format
        if writer.preps[0].trace is not None:  # the call's span (gateway/call/tracing.py)
            writer.preps[0].trace.fail(e)
        for chunk in writer.error(stream_failure(e)):
            yield chunk
        return
    for chunk in writer.end(finished):
        yield chunk
