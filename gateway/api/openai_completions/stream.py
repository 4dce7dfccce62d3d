"""OpenAI Completions streaming: ``text_completion`` chunks, usage if asked, ``[DONE]``."""

from __future__ import annotations

from typing import Any

from gateway.api.base import token_ids
from gateway.api.openai_chat.stream import DataStream
from gateway.api.openai_completions.protocol import choice_json
from gateway.api.openai_completions.translator import echoed, logprobs_json
from gateway.pipeline import Prepared, StreamEvent


class CompletionStream(DataStream):
    """A ``handler.StreamWriter`` for one prompt: with ``echo`` (or ``return_token_ids``) a
    first chunk per choice with the prompt (its ids); then the text as it comes, each
    chunk with its logprobs (character offsets running on) and its ids if asked; a finish
    chunk per choice; usage (if asked for) and ``[DONE]`` once the record is durable."""

    def __init__(self, prep: Prepared, tokenizer: Any, model: str) -> None:
        super().__init__(prep, tokenizer, model, "text_completion")
        self.prefix = echoed(prep, tokenizer) if prep.req.raw.get("echo") else ""
        self.offset = [len(self.prefix)] * prep.req.sampling.n

    def start(self) -> list[bytes]:
        if not (self.prefix or self.prep.req.return_token_ids):
            return []
        out = []
        for i in range(self.prep.req.sampling.n):
            choice = choice_json(i, self.prefix, None, None)
            out.append(self._chunk({**choice, **token_ids(self.prep)}))
        return out

    def event(self, ev: StreamEvent) -> list[bytes]:
        out = []
        if ev.text or ev.new_ids:
            logprobs = None
            if self.prep.req.sampling.logprobs:
                start = self.offset[ev.index]
                logprobs = logprobs_json(
                    self.tokenizer, ev.new_ids, ev.new_logprobs, ev.new_top or None, start
                )
                self.offset[ev.index] = start + sum(len(t) for t in logprobs["tokens"])
            choice = choice_json(ev.index, ev.text, logprobs, None)
            if self.prep.req.return_token_ids:
                choice["token_ids"] = ev.new_ids
            out.append(self._chunk(choice))
        if ev.finished:
            out.append(self._chunk(choice_json(ev.index, "", None, ev.finished.finish_reason)))
        return out
