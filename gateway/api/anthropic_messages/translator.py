"""Anthropic Messages <-> the internal request type.

Written by hand rather than through litellm's Anthropic adapter: the adapter goes
Anthropic -> OpenAI chat dicts -> (our) internal messages, loses track of which block a
bad value came from (so its errors cannot say what to change), imports slowly, and has
its own opinions about ``thinking`` and ``cache_control``. The mapping itself is small:

- ``system`` (string or text blocks) -> one system message; ``cache_control`` ignored;
  ``role: "system"`` entries inside ``messages`` (Claude Code sends them) stay where
  they stand;
- user ``text`` blocks -> user messages, ``tool_result`` blocks -> tool messages
  (``tool_use_id`` -> ``tool_call_id``), in block order;
- assistant ``text`` / ``tool_use`` / ``thinking`` blocks -> one assistant message with
  content, tool calls and reasoning;
- ``tools[].input_schema`` -> tool parameters; ``tool_choice`` auto/any/tool/none.

The token-exact path never passes through here: prompt ids, completion ids and logprobs
stay in the shared Pipeline; this module only shapes JSON.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from core.errors import APIError
from gateway.api import base
from gateway.api.anthropic_messages.protocol import (
    IGNORED,
    INVALID,
    MEDIA_BLOCKS,
    MessagesRequest,
    message_json,
    tool_input,
    usage_json,
)
from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest, Message, Sampling, Tool, ToolCallOut
from gateway.call.structured import anthropic_format
from gateway.edge.errors import bad_request
from schemas.atdp import ClientProtocol

PROTOCOL = ClientProtocol.anthropic_messages
ID_PREFIX = "msg_"


def _no_images(kind: str, where: str) -> APIError:
    return bad_request(
        f"{where} is a {kind} block, but the served model reads text only; send text blocks",
        where,
    )


def _block_text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad_request(f"{where} must be a content block object with a 'type'", where)
    kind = block["type"]
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise bad_request(f"{where}.text must be a string", f"{where}.text")
        return block["text"]
    if kind in MEDIA_BLOCKS:
        raise _no_images(kind, where)
    raise bad_request(f"{where} has type {kind!r}; only 'text' is allowed here", where)


def _system_text(system: str | list[Any] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    return "\n\n".join(_block_text(b, f"system[{i}]") for i, b in enumerate(system))


def _text_content(content: Any, where: str) -> str:
    """A string, or text blocks joined by newlines (tool results, mid-conversation system)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_block_text(b, f"{where}[{i}]") for i, b in enumerate(content))
    raise bad_request(f"{where} must be a string or a list of text blocks", where)


def parse_messages(raw: list[Any]) -> list[Message]:
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad_request(
                f"{where}.role must be 'user', 'assistant' or 'system' (got {role!r})",
                f"{where}.role",
            )
        content = m.get("content")
        if role == "system":  # Claude Code sends these mid-conversation; rendered in place
            out.append(Message("system", _text_content(content, f"{where}.content")))
            continue
        if isinstance(content, str):
            out.append(Message(role, content))
            continue
        if not isinstance(content, list):
            raise bad_request(
                f"{where}.content must be a string or a list of content blocks",
                f"{where}.content",
            )
        if role == "assistant":
            out.append(_assistant(content, where))
        else:
            out.extend(_user(content, where))
    return out


def _typed(blocks: list[Any], where: str) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(where, block, type) of each block; a 400 for one that is not a typed object."""
    for j, b in enumerate(blocks):
        w = f"{where}[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{w} must be a content block object with a 'type'", w)
        yield w, b, b["type"]


def _assistant(blocks: list[Any], where: str) -> Message:
    texts: list[str] = []
    calls: list[ToolCallOut] = []
    thoughts: list[str] = []
    for w, b, kind in _typed(blocks, f"{where}.content"):
        if kind == "text":
            texts.append(_block_text(b, w))
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_request(f"{w} (tool_use) needs a string 'id' and 'name'", w)
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise bad_request(f"{w}.input must be an object", f"{w}.input")
            calls.append(ToolCallOut(b["id"], b["name"], json.dumps(args)))
        elif kind == "thinking":
            if isinstance(b.get("thinking"), str):
                thoughts.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue  # opaque to us; nothing to render
        elif kind == "tool_result":
            raise bad_request(f"{w}: tool_result blocks belong in a user message", w)
        elif kind in MEDIA_BLOCKS:
            raise _no_images(kind, w)
        else:
            raise bad_request(f"{w} has unsupported content block type {kind!r}", w)
    reasoning = "\n".join(thoughts) if thoughts else None
    return Message("assistant", "".join(texts), tool_calls=calls, reasoning=reasoning)


def _user(blocks: list[Any], where: str) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(Message("user", "\n".join(texts)))
            texts.clear()

    for w, b, kind in _typed(blocks, f"{where}.content"):
        if kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise bad_request(
                    f"{w}.tool_use_id is required for a tool_result", f"{w}.tool_use_id"
                )
            flush()
            text = _text_content(b.get("content"), f"{w}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            out.append(Message("tool", text, tool_call_id=b["tool_use_id"]))
        elif kind in ("tool_use", "thinking", "redacted_thinking"):
            raise bad_request(f"{w}: {kind} blocks belong in an assistant message", w)
        else:
            texts.append(_block_text(b, w))
    flush()
    if not out:
        out.append(Message("user", ""))
    return out


def parse_tools(raw: list[Any] | None) -> list[Tool]:
    tools: list[Tool] = []
    for i, t in enumerate(raw or []):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad_request(f"{where} must be an object", where)
        kind = t.get("type")
        if kind not in (None, "custom"):
            raise bad_request(
                f"{where} is a {kind!r} tool; only custom tools (name, description, "
                "input_schema) are supported",
                f"{where}.type",
            )
        tools.append(
            base.function_tool(
                t.get("name"),
                t.get("description"),
                t.get("input_schema"),
                name_at=f"{where}.name",
                schema_at=f"{where}.input_schema",
                missing="is required and must be a JSON Schema object",
            )
        )
    return tools


_CHOICES = {"auto": "auto", "none": "none", "any": "required", "tool": "named"}
_NAMED = ("tool", "tool_choice.name")  # what Anthropic calls a tool, where it names one


def _tool_choice(choice: dict[str, Any] | None, tools: list[Tool]) -> tuple[Any, list[Tool]]:
    if choice is None:
        return "auto", tools
    mode = _CHOICES.get(choice.get("type"))  # type: ignore[arg-type]
    if mode is None:
        raise bad_request(
            "tool_choice.type must be one of auto, any, tool, none", "tool_choice.type"
        )
    picked = choice.get("name")
    return base.choose_tools(mode, tools, picked=picked, word="any", named=_NAMED)


def session_from_user_id(user_id: Any) -> str | None:
    """Claude Code's session id from ``metadata.user_id``: 2.x sends a JSON object as a
    string (``{"device_id": ..., "account_uuid": ..., "session_id": ...}``), 1.x sent
    ``user_<hash>_account_<uuid>_session_<uuid>``; any other string is used whole."""
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        with contextlib.suppress(ValueError):
            obj = json.loads(user_id)
            if isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
                return obj["session_id"] or None
    if "_session_" in user_id:
        return user_id.rsplit("_session_", 1)[1] or None
    return user_id[:200]


def to_internal(
    body: Any, session_header: str | None, *, count_only: bool = False
) -> GenerationRequest:
    req = base.validate(MessagesRequest, body, INVALID)
    base.reject_unknown(req, IGNORED)
    if req.max_tokens is None and not count_only:
        raise bad_request("max_tokens: Field required", "max_tokens")
    json_schema = anthropic_format(req.output_config)
    messages = parse_messages(req.messages)
    system = _system_text(req.system)
    if system is not None:
        messages.insert(0, Message("system", system))
    tools = parse_tools(req.tools)
    choice = _tool_choice(req.tool_choice, tools)
    stops = list(req.stop_sequences or [])
    if any(not s for s in stops):
        raise bad_request("stop_sequences must not contain empty strings", "stop_sequences")
    template_kwargs: dict[str, Any] = {}
    if req.thinking is not None:
        kind = req.thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive"):
            raise bad_request(
                "thinking.type must be 'enabled', 'disabled' or 'adaptive'", "thinking.type"
            )
        template_kwargs["enable_thinking"] = kind != "disabled"
    metadata = req.metadata or {}
    user_id = metadata.get("user_id")
    hint = session_header or session_from_user_id(user_id)
    sampling = Sampling(
        values=base.call_values(req, PROTOCOL),
        max_tokens=req.max_tokens,
        stop=stops,
        json_schema=json_schema,
    )
    fields = {
        "parallel_tool_calls": not (req.tool_choice or {}).get("disable_parallel_tool_use"),
        "chat_template_kwargs": template_kwargs,
        "user": user_id if isinstance(user_id, str) else None,
        "metadata": metadata,
        "session_hint": hint,
        "return_token_ids": req.return_token_ids,
    }
    return base.internal_request(PROTOCOL, req, body, messages, choice, sampling, **fields)


def display_messages(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored request's conversation (``system`` first) as the dashboard shows it."""

    def parse() -> list[Message]:
        messages = parse_messages(raw.get("messages") or [])
        system = _system_text(raw.get("system"))
        return [Message("system", system), *messages] if system is not None else messages

    return base.display_or_raw(parse, raw.get("messages"))


# ---- answers ------------------------------------------------------------------------


# the stop reason of an answer cut at its output limit, by what set the limit
_LENGTH_REASONS = {
    "client": "max_tokens",
    "context": "model_context_window_exceeded",
    "default": "end_turn",
}


def stop_info(prep: Prepared, c: Completion, tokenizer: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) in Anthropic's terms.

    A cut at the output limit is ``max_tokens`` only when the client's own ``max_tokens``
    was reached. One that did not fit the context (Claude Code asks for 32000) is an upper
    bound here (gateway/call/output_limit.py): a cut at the end of the context is
    ``model_context_window_exceeded``, a cut by the gateway's RLGATE_DEFAULT_MAX_TOKENS is
    ``end_turn`` (Claude Code treats both others as a failed turn; the record keeps
    finish_reason ``length``), as Responses reports ``completed`` then."""
    if c.finish_reason == "length":  # a forced turn's cut call too (gateway/call/cut_calls.py)
        return _LENGTH_REASONS[prep.limit.by], None
    if c.tool_calls:
        return "tool_use", None
    stops = prep.req.sampling.stop
    if stops and c.output_ids and c.output_ids[-1] != tokenizer.eos_token_id:
        # the engine trims the matched stop string from the text, the ids keep it
        full = tokenizer.decode(c.output_ids, skip_special_tokens=True)
        for s in stops:
            if full.startswith(s, len(c.text)):
                return "stop_sequence", s
    return "end_turn", None


def content_blocks(c: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if c.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.content:
        blocks.append({"type": "text", "text": c.content})
    for t in c.tool_calls:
        block = {"type": "tool_use", "id": t.id, "name": t.name}
        blocks.append({**block, "input": tool_input(t.arguments, t.cut)})
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def message_body(prep: Prepared, c: Completion, tokenizer: Any, model: str) -> dict[str, Any]:
    reason, seq = stop_info(prep, c, tokenizer)
    usage = usage_json(len(prep.prompt_ids), len(c.output_ids), c.cached_tokens)
    body = message_json(
        prep.interaction_id,
        model,
        content_blocks(c),
        usage,
        stop_reason=reason,
        stop_sequence=seq,
    )
    return {**body, **base.token_ids(prep, c)}
