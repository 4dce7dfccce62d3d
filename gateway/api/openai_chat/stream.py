"""OpenAI Chat Completions streaming: ``chat.completion.chunk`` events, ``[DONE]`` last."""

from __future__ import annotations

import time
from typing import Any

from core.errors import APIError
from gateway.api.base import sse_data, token_ids
from gateway.api.openai_chat.protocol import calls_usage, chunk_choice, tool_call_json
from gateway.api.openai_chat.translator import logprobs_content
from gateway.call.pipeline import Prepared, StreamEvent
from gateway.call.request import Completion
from gateway.edge.errors import OPENAI

DONE = b"data: [DONE]\n\n"  # the terminator of OpenAI's chunk streams


class OpenAIStream:
    """What OpenAI's two chunk streams (Chat Completions, Completions) share: chunks that
    carry the call's id, the error event, and the end: usage (if asked for) and
    ``[DONE]``, sent once the record is durable."""

    def __init__(self, prep: Prepared, obj: str, model: str) -> None:
        self.base = {
            "id": prep.interaction_id,
            "object": obj,
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": prep.policy_version,
        }

    def _chunk(self, *choices: dict[str, Any], **extra: Any) -> bytes:
        return sse_data({**self.base, "choices": list(choices), **extra})

    def error(self, e: APIError) -> list[bytes]:
        """A failure after the stream began: the error as an HTTP answer's body would be
        (the gateway's error format, the one status-to-type table), then ``[DONE]``."""
        return [sse_data(OPENAI.body(e)), DONE]

    def close(self, finished: list[Completion]) -> list[bytes]:
        return []

    def tail(self, include_usage: bool, calls: list[tuple[int, list[Completion]]]) -> list[bytes]:
        """The end: a usage chunk of ``calls`` (prompt tokens, choices) if asked, [DONE]."""
        usage = [self._chunk(usage=calls_usage(calls))] if include_usage else []
        return [*usage, DONE]


class ChatStream(OpenAIStream):
    """A ``handler.StreamWriter``: a role chunk per choice, then content, tool-call and finish
    chunks as they come; usage (if asked for) and ``[DONE]`` once the record is durable."""

    def __init__(self, prep: Prepared, tokenizer: Any, model: str) -> None:
        super().__init__(prep, "chat.completion.chunk", model)
        self.prep = prep
        self.tokenizer = tokenizer
        self.tool_index = [0] * prep.req.sampling.n

    def start(self) -> list[bytes]:
        role = {"role": "assistant", "content": ""}
        ids = token_ids(self.prep)  # the prompt's ids (return_token_ids), in the first chunk
        return [
            self._chunk(chunk_choice(i, role), **(ids if i == 0 else {}))
            for i in range(self.prep.req.sampling.n)
        ]

    def event(self, ev: StreamEvent) -> list[bytes]:
        out = []
        delta: dict[str, Any] = {}
        if ev.reasoning:
            delta["reasoning_content"] = ev.reasoning
        if ev.content:
            delta["content"] = ev.content
        logprobs = None
        if self.prep.req.sampling.logprobs and ev.new_ids:
            content = logprobs_content(
                self.tokenizer, ev.new_ids, ev.new_logprobs, ev.new_top or None
            )
            logprobs = {"content": content}
        if self.prep.req.return_token_ids and ev.new_ids:
            choice = chunk_choice(ev.index, delta, logprobs)
            out.append(self._chunk({**choice, "token_ids": ev.new_ids}))
        elif delta or logprobs:
            out.append(self._chunk(chunk_choice(ev.index, delta, logprobs)))
        for call in ev.tool_calls:
            k = self.tool_index[ev.index]
            self.tool_index[ev.index] += 1
            delta = {"tool_calls": [{"index": k, **tool_call_json(call)}]}
            out.append(self._chunk(chunk_choice(ev.index, delta)))
        if ev.finished:
            out.append(self._chunk(chunk_choice(ev.index, {}, None, ev.finished.finish_reason)))
        return out

    def end(self, finished: list[Completion]) -> list[bytes]:
        return self.tail(self.prep.req.include_usage, [(len(self.prep.prompt_ids), finished)])
