"""OpenAI Chat Completions streaming: ``chat.completion.chunk`` events, ``[DONE]`` last."""

from __future__ import annotations

import time
from typing import Any

from core.errors import APIError
from gateway.api.base import sse_data, token_ids
from gateway.api.openai_chat.protocol import chunk_choice, tool_call_json, usage_json
from gateway.api.openai_chat.translator import logprobs_content
from gateway.pipeline import Prepared, StreamEvent
from gateway.request import Completion


class DataStream:
    """What the OpenAI ``data:``-only streams share (Chat Completions, Completions): chunks
    of one ``object`` kind, an error event, and at the end usage (if asked for) and
    ``[DONE]`` once the record is durable. Subclasses write ``start`` and ``event``."""

    def __init__(self, prep: Prepared, tokenizer: Any, model: str, kind: str) -> None:
        self.prep = prep
        self.tokenizer = tokenizer
        self.base = {
            "id": prep.interaction_id,
            "object": kind,
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": prep.policy_version,
        }

    def _chunk(self, *choices: dict[str, Any], **extra: Any) -> bytes:
        return sse_data({**self.base, "choices": list(choices), **extra})

    def error(self, e: APIError) -> list[bytes]:
        return [
            sse_data({"error": {"message": e.message, "type": "server_error", "code": e.status}})
        ]

    def close(self, finished: list[Completion]) -> list[bytes]:
        return []

    def end(self, finished: list[Completion]) -> list[bytes]:
        out = []
        if self.prep.req.include_usage:
            ct = sum(len(c.output_ids) for c in finished)
            cached = min((c.cached_tokens for c in finished), default=0)
            out.append(self._chunk(usage=usage_json(len(self.prep.prompt_ids), ct, cached)))
        return [*out, b"data: [DONE]\n\n"]


class ChatStream(DataStream):
    """A ``handler.StreamWriter``: a role chunk per choice, then content, tool-call and finish
    chunks as they come; usage (if asked for) and ``[DONE]`` once the record is durable."""

    def __init__(self, prep: Prepared, tokenizer: Any, model: str) -> None:
        super().__init__(prep, tokenizer, model, "chat.completion.chunk")
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
