"""Output parsers: reasoning (``<think>``) and tool calls, whole-text and streaming.

Parsers read decoded text only; the recorded token ids are never touched. Malformed
tool-call text stays text. Tool-call formats are pluggable: register a parser class in
``TOOL_PARSERS``.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from gateway.call.request import ToolCallOut


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _call(name: object, args: object) -> ToolCallOut | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        arguments = args
    elif isinstance(args, dict):
        arguments = json.dumps(args)
    elif args is None:
        arguments = "{}"
    else:
        return None
    return ToolCallOut(id=new_call_id(), name=name, arguments=arguments)


class HermesToolParser:
    """Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; a call
    of a custom tool (one of ``custom``, gateway/call/custom_tools.py) is
    ``<tool_call name="NAME">\nINPUT\n</tool_call>``, its input raw text."""

    start = "<tool_call>"
    end = "</tool_call>"
    separator = "\n"  # between two calls, when the call is forced (gateway/call/forced_tools.py)
    _block = re.compile(r'<tool_call(?: name="([A-Za-z0-9_-]+)")?>(.*?)</tool_call>', re.S)

    def __init__(self, custom: frozenset[str] = frozenset()) -> None:
        self.custom = custom
        if custom:  # a custom call opens with '<tool_call name=': hold that back too
            self.start = "<tool_call"

    @staticmethod
    def frame(name: str) -> tuple[str, str]:
        """The text around a call's arguments, as the template's tool prompt shows it."""
        return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": ', "}\n</tool_call>"

    @staticmethod
    def custom_frame(name: str) -> tuple[str, str]:
        """The text around a custom call's input (raw: never JSON-escaped)."""
        return f'<tool_call name="{name}">\n', "\n</tool_call>"

    def _custom_call(self, name: str, body: str) -> ToolCallOut | None:
        if name not in self.custom:
            return None
        text = body.removeprefix("\n").removesuffix("\n")  # the frame's own newlines
        return ToolCallOut(id=new_call_id(), name=name, arguments=text, custom=True)

    def parse(self, text: str) -> tuple[str, list[ToolCallOut]]:
        if self.start not in text:
            return text, []
        calls: list[ToolCallOut] = []
        for name, body in self._block.findall(text):
            if name:
                call = self._custom_call(name, body)
                if call is None:
                    return text, []
                calls.append(call)
                continue
            try:
                obj = json.loads(body.strip())
            except json.JSONDecodeError:
                return text, []
            if not isinstance(obj, dict):
                return text, []
            call = _call(obj.get("name"), obj.get("arguments", obj.get("parameters")))
            if call is None:
                return text, []
            calls.append(call)
        if not calls:
            return text, []
        content = text[: text.index(self.start)].strip()
        return content, calls


class Llama3JsonToolParser:
    """Llama 3.x JSON: the whole answer is ``{"name": ..., "parameters": {...}}``
    (or several separated by ``;``), optionally after ``<|python_tag|>``."""

    start = "{"
    end = "}"
    separator = ";"
    custom_frame = None  # no custom-call format: forcing a custom call is refused

    def __init__(self, custom: frozenset[str] = frozenset()) -> None:
        self.custom = custom  # never read: this format has no custom calls

    @staticmethod
    def frame(name: str) -> tuple[str, str]:
        return f'{{"name": {json.dumps(name)}, "parameters": ', "}"

    def parse(self, text: str) -> tuple[str, list[ToolCallOut]]:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        calls: list[ToolCallOut] = []
        for part in body.split(";"):
            try:
                obj = json.loads(part)
            except json.JSONDecodeError:
                return text, []
            if not isinstance(obj, dict):
                return text, []
            call = _call(obj.get("name"), obj.get("parameters", obj.get("arguments")))
            if call is None:
                return text, []
            calls.append(call)
        return "", calls


TOOL_PARSERS = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``<think>r</think>c`` -> (r, c). A template may open the block in the prompt, so a
    lone ``</think>`` also ends reasoning."""
    if "</think>" not in text:
        if text.lstrip().startswith("<think>"):
            return text.lstrip()[len("<think>") :], ""
        return None, text
    head, tail = text.split("</think>", 1)
    head = head.lstrip()
    head = head.removeprefix("<think>")
    return head.strip(), tail.lstrip()


@dataclass
class StreamDelta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)


class StreamingParser:
    """Turns cumulative decoded text into content / reasoning / tool-call deltas.

    Content is released as soon as it cannot be the start of a marker; text inside a tool
    call is held until the call closes, then released as one complete tool-call delta.
    """

    def __init__(self, tool_parser: HermesToolParser | None, reasoning: bool) -> None:
        self.tool_parser = tool_parser if isinstance(tool_parser, HermesToolParser) else None
        self.in_reasoning = reasoning
        self.reasoning_enabled = reasoning
        self.buf = ""  # text not yet released
        self.in_call = False
        self.calls: list[ToolCallOut] = []

    @staticmethod
    def _held_back(text: str, marker: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of marker."""
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-k:]):
                return k
        return 0

    def feed(self, delta: str, final: bool = False) -> StreamDelta:
        out = StreamDelta()
        self.buf += delta
        while True:
            if self.in_reasoning:
                self.buf = (
                    self.buf.removeprefix("<think>") if self.buf.startswith("<think>") else self.buf
                )
                if "</think>" in self.buf:
                    r, self.buf = self.buf.split("</think>", 1)
                    out.reasoning += r
                    self.buf = self.buf.lstrip()
                    self.in_reasoning = False
                    continue
                keep = 0 if final else self._held_back(self.buf, "</think>")
                out.reasoning += self.buf[: len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            if self.tool_parser is None:
                out.content += self.buf
                self.buf = ""
                return out
            start, end = self.tool_parser.start, self.tool_parser.end
            if self.in_call:
                if end in self.buf:
                    body, self.buf = self.buf.split(end, 1)
                    content, calls = self.tool_parser.parse(start + body + end)
                    if calls:
                        out.tool_calls.extend(calls)
                        self.calls.extend(calls)
                    else:  # malformed: give the text back as content
                        out.content += start + body + end
                    self.in_call = False
                    continue
                if final:
                    out.content += start + self.buf
                    self.buf = ""
                return out
            if start in self.buf:
                before, self.buf = self.buf.split(start, 1)
                out.content += before
                self.in_call = True
                continue
            keep = 0 if final else self._held_back(self.buf, start)
            out.content += self.buf[: len(self.buf) - keep]
            self.buf = self.buf[len(self.buf) - keep :]
            return out


def parse_output(
    text: str, tool_parser: str | None, reasoning: bool, custom: frozenset[str] = frozenset()
) -> tuple[str | None, str | None, list[ToolCallOut]]:
    """Whole-text parse: (content, reasoning, tool_calls); ``custom``: the custom tools
    offered, whose calls are read in their own envelope."""
    thought: str | None = None
    if reasoning:
        thought, text = split_reasoning(text)
    calls: list[ToolCallOut] = []
    if tool_parser:
        text, calls = TOOL_PARSERS[tool_parser](custom).parse(text)
    content = text if text or not calls else None
    return content, thought, calls
