"""JSON cut short, read as far as it goes: what Anthropic answers as a cut ``tool_use``
block's ``input`` (``stop_reason: "max_tokens"``), an object holding every member whose
value was generated, a string value as far as it was written.

``{"city": "Pa`` -> ``{"city": "Pa"}``; ``{"a": 1, "ke`` -> ``{"a": 1}``;
``{"a": [1, {"b": tr`` -> ``{"a": [1, {}]}``. Linear in the text: one scan records, at
each point a value or container ended (or opened), the closers that would finish the
text there; the last point whose text parses wins.
"""

from __future__ import annotations

import json
from typing import Any

_CLOSE = {"{": "}", "[": "]"}


def _candidates(text: str) -> list[str]:
    """Texts that finish ``text``, most complete first: the whole of it (an open string
    closed), then each point where a value or container ended or opened, latest first."""
    stack: list[str] = []
    in_string = False
    escaped = False
    points: list[tuple[int, str]] = []  # (end of prefix, its closers)
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                points.append((i + 1, "".join(_CLOSE[c] for c in reversed(stack))))
            continue
        if ch == '"':
            in_string = True
        elif ch in _CLOSE:
            stack.append(ch)
            points.append((i + 1, "".join(_CLOSE[c] for c in reversed(stack))))
        elif ch in "}]":
            if stack:
                stack.pop()
            points.append((i + 1, "".join(_CLOSE[c] for c in reversed(stack))))
        elif ch in ",":
            points.append((i, "".join(_CLOSE[c] for c in reversed(stack))))
    closers = "".join(_CLOSE[c] for c in reversed(stack))
    whole = text + ('"' if in_string and not escaped else "") + closers
    return [whole, text + closers] + [text[:end] + close for end, close in reversed(points)]


TRIES = 16  # a key, its value and their points alternate: one of the first few parses


def parse_partial(text: str) -> Any:
    """The value of JSON ``text`` cut short, as far as it parses; None when none of its
    first ``TRIES`` finishings does (each try is linear in the text)."""
    for candidate in _candidates(text.strip())[:TRIES]:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None
