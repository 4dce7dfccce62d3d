"""A forced turn (gateway/call/forced_tools.py) cut by its output limit: its calls as calls.

The engine decodes a forced turn under a grammar that admits only calls, in the gateway's
tool-call format, so its text is complete calls, then (when the output limit cut it) one
call cut short: ``<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Pa``. The
whole-text parser (gateway/call/parsing.py) reads only closed calls and would give the cut
one back as text, markup and all. Here the text is read as the grammar wrote it, call
by call, by each tool's frame (``frame``/``custom_frame``: the text around its
arguments): the closed calls, then the cut one with its tool and its arguments as
generated so far, marked ``cut``. Each API answers that as its own cut call (Chat
``finish_reason: "length"``, Responses an ``incomplete`` item, Anthropic
``stop_reason: "max_tokens"``), and the record keeps it so.

A cut inside a frame, before the tool's name is complete, names the tool only when one
tool could be called (one offered or one named): that call has empty arguments.
Otherwise it is dropped (there is nothing to call). The turn's text is always empty,
never the markup. A call whose arguments are whole, cut in its closing text, is whole.
"""

from __future__ import annotations

import json

from gateway.call.parsing import TOOL_PARSERS, new_call_id
from gateway.call.request import Tool, ToolCallOut

_JSON = json.JSONDecoder()


def _frames(fmt: type, tools: list[Tool]) -> list[tuple[Tool, str, str]]:
    """(tool, text before its arguments, text after them) of each tool a call can be of."""
    out = []
    for t in tools:
        frame = fmt.frame if t.custom is None else fmt.custom_frame  # type: ignore[attr-defined]
        if frame is not None:
            out.append((t, *frame(t.name)))
    return out


def _less_end(text: str, end: str) -> str:
    """``text`` without the longest suffix that begins ``end`` (a cut in the closing)."""
    for k in range(min(len(end), len(text)), 0, -1):
        if end.startswith(text[-k:]):
            return text[:-k]
    return text


def _call(tool: Tool, args: str, cut: bool) -> ToolCallOut:
    return ToolCallOut(new_call_id(), tool.name, args, custom=tool.custom is not None, cut=cut)


def cut_calls(text: str, parser: str, tools: list[Tool]) -> list[ToolCallOut]:
    """The calls of a forced turn's ``text`` cut by its output limit: the closed ones,
    then the cut one (``cut=True``) if it names a tool."""
    fmt = TOOL_PARSERS[parser]
    frames = _frames(fmt, tools)
    skip = " \t\r\n" + fmt.separator
    calls: list[ToolCallOut] = []
    p = 0
    while True:
        while p < len(text) and text[p] in skip:
            p += 1
        rest = text[p:]
        if not rest:
            return calls
        match = next((f for f in frames if rest.startswith(f[1])), None)
        if match is None:  # cut inside a frame's opening
            if len(frames) == 1 and frames[0][1].startswith(rest):
                calls.append(_call(frames[0][0], "", cut=True))
            return calls
        tool, begin, end = match
        a = p + len(begin)
        if tool.custom is not None:  # raw input up to the frame's end
            e = text.find(end, a)
            if e < 0:
                calls.append(_call(tool, _less_end(text[a:], end), cut=True))
                return calls
            calls.append(_call(tool, text[a:e], cut=False))
            p = e + len(end)
            continue
        while a < len(text) and text[a] in " \t\r\n":
            a += 1
        try:
            _, b = _JSON.raw_decode(text, a)
        except json.JSONDecodeError:  # the arguments were cut
            calls.append(_call(tool, text[a:], cut=True))
            return calls
        calls.append(_call(tool, text[a:b], cut=False))
        if not text.startswith(end, b):  # cut in the closing (or not this format's text)
            return calls
        p = b + len(end)
