"""Refuse up front, with a 400, what the database could not store.

A request is recorded after it is answered; if the database then refused the record (a
NUL character in JSONB or text, a lone UTF-16 surrogate, a string longer than its
column) the answer would already be gone. So every JSON body is checked when it is read
(``check_body``), and the values that land in bounded columns are checked where they are
taken from the request (``bounded_str``, ``check_session_fields``). The limits come from
``schemas/tables.py``: ``sessions.external_id``/``task_id``/``agent_name`` are
``String(200)``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from core.errors import APIError
from gateway.edge.errors import bad_request

MAX_DEPTH = 64  # arrays/objects inside each other; real API bodies use under 10
SESSION_FIELD_MAX = 200  # sessions.external_id, task_id, agent_name: String(200)

# NUL (PostgreSQL stores neither in text nor in JSONB) and lone surrogates (not UTF-8)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def too_deep() -> APIError:
    return bad_request(f"the JSON body is nested more than {MAX_DEPTH} levels deep; flatten it")


def unstorable(s: str) -> bool:
    """Whether ``s`` holds a character the database cannot store (NUL, lone surrogate)."""
    return _UNSTORABLE.search(s) is not None


def bad_char(where: str, s: str, param: str | None = None) -> APIError:
    """The 400 for ``s`` (found at ``where``; ``param`` defaults to it), which holds a
    character that cannot be stored."""
    ch = _UNSTORABLE.search(s)
    what = (
        "a NUL character (\\u0000)"
        if ch and ch.group() == "\x00"
        else "an unpaired UTF-16 surrogate (\\ud800-\\udfff)"
    )
    return bad_request(
        f"{where} contains {what}, which cannot be stored; remove it", param or where
    )


def _path(parts: tuple[Any, ...]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "the request body"


def check_body(body: Any) -> Any:
    """``body`` unchanged if it can be stored; a 400 naming the first place that cannot
    (over-deep nesting, NUL or unpaired surrogate in any string or key). Iterative, so
    any depth is safe to inspect."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(body, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _UNSTORABLE.search(node):
                raise bad_char(_path(path), node)
            if node.count("[") + node.count("{") > MAX_DEPTH and _deep_json_text(node):
                raise bad_request(
                    f"{_path(path)} holds JSON nested more than {MAX_DEPTH} levels deep; "
                    "flatten it",
                    _path(path),
                )
            continue
        if not isinstance(node, dict | list):
            continue
        if len(path) >= MAX_DEPTH:
            raise too_deep()
        if isinstance(node, dict):
            for k, v in node.items():
                if _UNSTORABLE.search(k):
                    raise bad_char(f"a key in {_path(path)}", k)
                stack.append((v, (*path, k)))
        else:
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
    return body


def _too_deep(obj: Any) -> bool:
    stack = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                return True
            items = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in items)
    return False


def _deep_json_text(text: str) -> bool:
    """Whether a string (tool-call arguments, say) is JSON nested past ``MAX_DEPTH``:
    rendering the prompt and stitching sessions parse such strings."""
    if not text.lstrip().startswith(("[", "{")):
        return False
    try:
        return _too_deep(json.loads(text))
    except RecursionError:
        return True
    except ValueError:
        return False


def bounded_str(body: dict[str, Any], name: str, limit: int = SESSION_FIELD_MAX) -> str | None:
    """``body[name]`` as an optional string of at most ``limit`` characters; 400 otherwise."""
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request(f"'{name}' must be a string", name)
    if len(v) > limit:
        raise bad_request(
            f"'{name}' is {len(v)} characters long; at most {limit} are allowed", name
        )
    if _UNSTORABLE.search(v):
        raise bad_char(f"'{name}'", v)
    return v


def check_session_fields(external_id: str | None, agent_name: Any) -> None:
    """The client's own session id (``X-Session-Id``, Codex's ``session-id`` header or
    Claude Code's ``metadata.user_id``) and ``metadata.agent_name`` become
    ``sessions.external_id`` and ``sessions.agent_name``: check them before generating."""
    if external_id is not None:
        if len(external_id) > SESSION_FIELD_MAX:
            raise bad_request(
                f"the session id (X-Session-Id header or metadata.user_id) is "
                f"{len(external_id)} characters long; at most {SESSION_FIELD_MAX} are "
                "allowed: send a shorter one",
                "X-Session-Id",
            )
        if _UNSTORABLE.search(external_id):
            raise bad_char("the session id (X-Session-Id header or metadata.user_id)", external_id)
    if agent_name is not None:
        bounded_str({"metadata.agent_name": agent_name}, "metadata.agent_name")
