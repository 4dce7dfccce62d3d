"""Anthropic Messages streaming: ``message_start``, content blocks opened, filled and
closed in order, then ``message_delta`` (once the record is durable) and ``message_stop``."""

from __future__ import annotations

import json
import time
from typing import Any

from core.errors import APIError
from gateway.api.anthropic_messages.protocol import ERRORS, message_json, tool_input, usage_json
from gateway.api.anthropic_messages.translator import stop_info
from gateway.api.base import sse_event, token_ids
from gateway.call.pipeline import Prepared, StreamEvent
from gateway.call.request import Completion, ToolCallOut

PING_EVERY_S = 10


def _event(obj: dict[str, Any]) -> bytes:
    return sse_event(obj["type"], obj)


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return _event({"type": "content_block_delta", "index": index, "delta": delta})


class _Blocks:
    """Opens, fills and closes content blocks in the order Anthropic streams them."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" | "thinking"

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_event({"type": "content_block_stop", "index": self.index})]

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = block["type"] if block["type"] in ("text", "thinking") else None
        out.append(
            _event({"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return out

    def thinking(self, text: str) -> list[bytes]:
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        out = [] if self.open == "thinking" else self.start(empty)
        return [*out, _delta(self.index, {"type": "thinking_delta", "thinking": text})]

    def text(self, text: str) -> list[bytes]:
        out = [] if self.open == "text" else self.start({"type": "text", "text": ""})
        return [*out, _delta(self.index, {"type": "text_delta", "text": text})]

    def tool(self, call: ToolCallOut) -> list[bytes]:
        out = self.start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        partial = json.dumps(tool_input(call.arguments, call.cut))
        out.append(_delta(self.index, {"type": "input_json_delta", "partial_json": partial}))
        out.append(_event({"type": "content_block_stop", "index": self.index}))
        return out


class MessagesStream:
    """A ``handler.StreamWriter`` for ``POST /v1/messages`` with ``stream: true``."""

    def __init__(self, prep: Prepared, tokenizer: Any, model: str) -> None:
        self.prep = prep
        self.tokenizer = tokenizer
        self.model = model
        self.blocks = _Blocks()
        self.last_ping = time.monotonic()

    def start(self) -> list[bytes]:
        usage = usage_json(len(self.prep.prompt_ids), 0)
        message = message_json(self.prep.interaction_id, self.model, [], usage)
        message.update(token_ids(self.prep))  # return_token_ids: the prompt's ids
        return [_event({"type": "message_start", "message": message}), _event({"type": "ping"})]

    def event(self, ev: StreamEvent) -> list[bytes]:
        out: list[bytes] = []
        if ev.reasoning:
            out += self.blocks.thinking(ev.reasoning)
        if ev.content:
            out += self.blocks.text(ev.content)
        for call in ev.tool_calls:
            out += self.blocks.tool(call)
        if time.monotonic() - self.last_ping > PING_EVERY_S:
            self.last_ping = time.monotonic()
            out.append(_event({"type": "ping"}))
        return out

    def error(self, e: APIError) -> list[bytes]:
        """A failure after the stream began: an ``error`` event whose data is the HTTP
        answer's body (Anthropic's error format, the one status-to-type table)."""
        return [_event(ERRORS.body(e))]

    def close(self, finished: list[Completion]) -> list[bytes]:
        if not finished:  # pragma: no cover - the pipeline always ends with a final event
            return self.error(APIError(500, "no output"))
        out = []
        if self.blocks.index < 0:  # nothing was generated: still one (empty) text block
            out += self.blocks.start({"type": "text", "text": ""})
        return out + self.blocks.close()

    def end(self, finished: list[Completion]) -> list[bytes]:
        (c,) = finished
        reason, seq = stop_info(self.prep, c, self.tokenizer)
        delta = {"stop_reason": reason, "stop_sequence": seq}
        return [
            _event(
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": {"output_tokens": len(c.output_ids)},
                    **({"token_ids": c.output_ids} if self.prep.req.return_token_ids else {}),
                }
            ),
            _event({"type": "message_stop"}),
        ]
