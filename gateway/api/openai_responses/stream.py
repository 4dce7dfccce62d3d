"""OpenAI Responses streaming: ``response.created``, output items opened, filled and
closed in OpenAI's order, then ``response.completed`` (once the record is durable)."""

from __future__ import annotations

import time
from typing import Any

from core.errors import APIError
from gateway.api.base import sse_event
from gateway.api.openai_responses.protocol import call_item, message_item, new_id, reasoning_item
from gateway.api.openai_responses.translator import namespaces, response_object
from gateway.call.pipeline import Prepared, StreamEvent
from gateway.call.request import Completion, ToolCallOut
from gateway.edge.errors import OPENAI


class _Items:
    """Output items as they stream: opens, fills and closes them in OpenAI's order."""

    def __init__(self, ns: dict[str, str] | None = None) -> None:
        self.ns = ns
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.open: str | None = None  # "message" | "reasoning"
        self.text = ""

    def ev(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse_event(kind, obj)

    @property
    def index(self) -> int:
        return len(self.items) - 1

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        item = self.items[-1]
        ref = {"item_id": item["id"], "output_index": self.index, "content_index": 0}
        out = []
        if self.open == "message":
            final = message_item(item["id"], self.text)
            part = final["content"][0]
            out.append(self.ev("response.output_text.done", **ref, text=self.text, logprobs=[]))
        else:
            final = reasoning_item(item["id"], self.text)
            part = final["content"][0]
            out.append(self.ev("response.reasoning_text.done", **ref, text=self.text))
        out.append(self.ev("response.content_part.done", **ref, part=part))
        self.items[-1] = final
        out.append(self.ev("response.output_item.done", output_index=self.index, item=final))
        self.open, self.text = None, ""
        return out

    def start(self, kind: str) -> list[bytes]:
        out = self.close()
        if kind == "message":
            item = message_item(new_id("msg"), "", "in_progress")
            item["content"] = []
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = reasoning_item(new_id("rs"), "")
            item["content"] = []
            part = {"type": "reasoning_text", "text": ""}
        self.items.append(item)
        self.open = kind
        out.append(self.ev("response.output_item.added", output_index=self.index, item=item))
        out.append(
            self.ev(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.index,
                content_index=0,
                part=part,
            )
        )
        return out

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = [] if self.open == kind else self.start(kind)
        self.text += text
        ref = {"item_id": self.items[-1]["id"], "output_index": self.index, "content_index": 0}
        if kind == "message":
            out.append(self.ev("response.output_text.delta", **ref, delta=text, logprobs=[]))
        else:
            out.append(self.ev("response.reasoning_text.delta", **ref, delta=text))
        return out

    def call(self, call: ToolCallOut) -> list[bytes]:
        out = self.close()
        item_id = new_id("ctc" if call.custom else "fc")
        added = call_item(item_id, call, "in_progress", self.ns)
        added["input" if call.custom else "arguments"] = ""
        self.items.append(call_item(item_id, call, ns=self.ns))
        ref = {"item_id": item_id, "output_index": self.index}
        out.append(self.ev("response.output_item.added", output_index=self.index, item=added))
        if call.custom:  # a custom call's input (OpenAI's custom_tool_call_input events)
            out.append(
                self.ev("response.custom_tool_call_input.delta", **ref, delta=call.arguments)
            )
            out.append(self.ev("response.custom_tool_call_input.done", **ref, input=call.arguments))
        else:
            kind = "response.function_call_arguments"
            out.append(self.ev(f"{kind}.delta", **ref, delta=call.arguments))
            out.append(self.ev(f"{kind}.done", **ref, name=call.name, arguments=call.arguments))
        out.append(
            self.ev("response.output_item.done", output_index=self.index, item=self.items[-1])
        )
        return out


class ResponsesStream:
    """A ``handler.StreamWriter`` for ``POST /v1/responses`` with ``stream: true``."""

    def __init__(self, prep: Prepared, model: str) -> None:
        self.prep = prep
        self.model = model
        self.created = int(time.time())
        self.items = _Items(namespaces(prep.req.raw.get("tools")))

    def _response(self, status: str, completion: Completion | None = None) -> dict[str, Any]:
        return response_object(
            self.prep,
            model=self.model,
            status=status,
            output=self.items.items,
            completion=completion,
            created=self.created,
        )

    def start(self) -> list[bytes]:
        start = self._response("in_progress")
        return [
            self.items.ev("response.created", response=start),
            self.items.ev("response.in_progress", response=start),
        ]

    def event(self, ev: StreamEvent) -> list[bytes]:
        out: list[bytes] = []
        if ev.reasoning:
            out += self.items.delta("reasoning", ev.reasoning)
        if ev.content:
            out += self.items.delta("message", ev.content)
        for call in ev.tool_calls:
            out += self.items.call(call)
        return out

    def error(self, e: APIError) -> list[bytes]:
        """A failure after the stream began: ``response.failed``, its error's ``code`` the
        type an HTTP answer would have (the gateway's error format, the one table)."""
        failed = self._response("failed")
        failed["error"] = {"code": OPENAI.kind(e.status), "message": e.message}
        return [self.items.ev("response.failed", response=failed)]

    def close(self, finished: list[Completion]) -> list[bytes]:
        if not finished:  # pragma: no cover - the pipeline always ends with a final event
            return []
        out = [] if self.items.items else self.items.start("message")  # still one message
        return out + self.items.close()

    def end(self, finished: list[Completion]) -> list[bytes]:
        final = self._response("completed", finished[0])
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [self.items.ev(kind, response=final)]
