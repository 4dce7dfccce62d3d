"""Anthropic Messages: a thin translator to and from the internal request type.

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
import time
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import APIError
from gateway.errors import bad_request
from gateway.openai_chat import TOOL_NAME
from gateway.request import Completion, GenerationRequest, Message, Sampling, Tool, ToolCallOut
from gateway.service import Pipeline, Prepared, StreamEvent, replay
from gateway.structured import anthropic_format

PROTOCOL = "anthropic-messages"
_IMAGE_KINDS = ("image", "document", "search_result", "container_upload")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class MessagesRequest(_Loose):
    model: str = Field(min_length=1)
    messages: list[Any] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    system: str | list[Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


# accepted and ignored: they do not change what the model generates here
_IGNORED = {
    "service_tier",
    "container",
    "context_management",
    "mcp_servers",
    "cache_control",
    "inference_geo",
    "speed",
    "diagnostics",
    "workspace_id",
    "user_profile_id",
    "billing_policy",
    "fallbacks",
    "fallback_credit_token",
    "betas",
}


def _validation_message(e: ValidationError) -> tuple[str, str]:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{loc}: {err['msg']}", loc


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
    if kind in _IMAGE_KINDS:
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


def _assistant(blocks: list[Any], where: str) -> Message:
    texts: list[str] = []
    calls: list[ToolCallOut] = []
    thoughts: list[str] = []
    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{w} must be a content block object with a 'type'", w)
        kind = b["type"]
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
        elif kind in _IMAGE_KINDS:
            raise _no_images(kind, w)
        else:
            raise bad_request(f"{w} has unsupported content block type {kind!r}", w)
    reasoning = "\n".join(thoughts) if thoughts else None
    return Message("assistant", "".join(texts), calls, reasoning=reasoning)


def _user(blocks: list[Any], where: str) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(Message("user", "\n".join(texts)))
            texts.clear()

    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{w} must be a content block object with a 'type'", w)
        kind = b["type"]
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
        name = t.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise bad_request(f"{where}.name must match ^[A-Za-z0-9_-]{{1,64}}$", f"{where}.name")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise bad_request(
                f"{where}.input_schema is required and must be a JSON Schema object",
                f"{where}.input_schema",
            )
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise bad_request(
                f"{where}.input_schema is not a valid JSON Schema: {e.message}",
                f"{where}.input_schema",
            ) from None
        tools.append(Tool(name, str(t.get("description") or ""), schema))
    return tools


def _tool_choice(choice: dict[str, Any] | None, tools: list[Tool]) -> tuple[Any, list[Tool]]:
    if choice is None:
        return "auto", tools
    kind = choice.get("type")
    if kind == "auto":
        return "auto", tools
    if kind == "none":
        return "none", tools
    if kind == "any":
        if not tools:
            raise bad_request("tool_choice 'any' needs tools", "tool_choice")
        return "required", tools
    if kind == "tool":
        picked = [t for t in tools if t.name == choice.get("name")]
        if not picked:
            raise bad_request("tool_choice names a tool that is not in tools", "tool_choice.name")
        return "required", picked
    raise bad_request("tool_choice.type must be one of auto, any, tool, none", "tool_choice.type")


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
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        req = MessagesRequest.model_validate(body)
    except ValidationError as e:
        msg, loc = _validation_message(e)
        raise bad_request(msg, loc) from None
    unknown = set(req.model_extra or {}) - _IGNORED
    if unknown:
        raise bad_request(
            f"unsupported parameter(s): {', '.join(sorted(unknown))}", sorted(unknown)[0]
        )
    if req.max_tokens is None and not count_only:
        raise bad_request("max_tokens: Field required", "max_tokens")
    json_schema = anthropic_format(req.output_config)
    messages = parse_messages(req.messages)
    system = _system_text(req.system)
    if system is not None:
        messages.insert(0, Message("system", system))
    tools = parse_tools(req.tools)
    tool_choice, tools = _tool_choice(req.tool_choice, tools)
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
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if not req.top_k else req.top_k,
        max_tokens=req.max_tokens,
        stop=stops,
        json_schema=json_schema,
    )
    return GenerationRequest(
        protocol=PROTOCOL,
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling,
        stream=req.stream,
        chat_template_kwargs=template_kwargs,
        user=user_id if isinstance(user_id, str) else None,
        metadata=metadata,
        session_hint=hint,
        raw=body,
    )


# ---- responses ----------------------------------------------------------------------


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def stop_info(
    prep: Prepared, c: Completion, tokenizer: Any, context_length: int | None = None
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) in Anthropic's terms.

    ``max_tokens`` only when the client's own ``max_tokens`` was reached. When it did not
    fit the context (Claude Code asks for 32000), the routes drop it and the answer gets
    what the context leaves, or the gateway's RLGATE_DEFAULT_MAX_TOKENS if smaller: a cut
    at the end of the context is ``model_context_window_exceeded``, a cut by the gateway's
    default is ``end_turn`` (Claude Code treats both others as a failed turn; the record
    keeps finish_reason ``length``), as Responses reports ``completed`` then."""
    if c.tool_calls:
        return "tool_use", None
    if c.finish_reason == "length":
        if prep.req.sampling.max_tokens is not None:
            return "max_tokens", None
        if context_length and len(prep.prompt_ids) + len(c.output_ids) >= context_length:
            return "model_context_window_exceeded", None
        return "end_turn", None
    stops = prep.req.sampling.stop
    if stops and c.output_ids and c.output_ids[-1] != tokenizer.eos_token_id:
        # the engine trims the matched stop string from the text, the ids keep it
        full = tokenizer.decode(c.output_ids, skip_special_tokens=True)
        for s in stops:
            if full.startswith(s, len(c.text)):
                return "stop_sequence", s
    return "end_turn", None


def usage(prep: Prepared, output_tokens: int, cached: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": len(prep.prompt_ids),
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def content_blocks(c: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if c.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.content:
        blocks.append({"type": "text", "text": c.content})
    for t in c.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": t.id, "name": t.name, "input": _tool_input(t.arguments)}
        )
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def message_body(
    prep: Prepared, c: Completion, tokenizer: Any, model: str, context_length: int | None = None
) -> dict[str, Any]:
    reason, seq = stop_info(prep, c, tokenizer, context_length)
    return {
        "id": prep.interaction_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(c),
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(prep, len(c.output_ids), c.cached_tokens),
    }


async def count_body(pipeline: Pipeline, req: GenerationRequest) -> dict[str, Any]:
    """count_tokens: the prompt's ids are rendered as for a call (char limit first, then
    the render pool), so counting is bounded the same way."""
    return {"input_tokens": len(await pipeline.prompt_ids(req))}


# ---- streaming ----------------------------------------------------------------------


def sse(kind: str, obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def _event(obj: dict[str, Any]) -> bytes:
    return sse(obj["type"], obj)


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
        out = (
            []
            if self.open == "thinking"
            else self.start({"type": "thinking", "thinking": "", "signature": ""})
        )
        out.append(
            _event(
                {
                    "type": "content_block_delta",
                    "index": self.index,
                    "delta": {"type": "thinking_delta", "thinking": text},
                }
            )
        )
        return out

    def text(self, text: str) -> list[bytes]:
        out = [] if self.open == "text" else self.start({"type": "text", "text": ""})
        out.append(
            _event(
                {
                    "type": "content_block_delta",
                    "index": self.index,
                    "delta": {"type": "text_delta", "text": text},
                }
            )
        )
        return out

    def tool(self, call: ToolCallOut) -> list[bytes]:
        out = self.start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        out.append(
            _event(
                {
                    "type": "content_block_delta",
                    "index": self.index,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(_tool_input(call.arguments)),
                    },
                }
            )
        )
        out.append(_event({"type": "content_block_stop", "index": self.index}))
        return out


def event_bytes(ev: StreamEvent, blocks: _Blocks) -> list[bytes]:
    out: list[bytes] = []
    if ev.reasoning:
        out += blocks.thinking(ev.reasoning)
    if ev.content:
        out += blocks.text(ev.content)
    for call in ev.tool_calls:
        out += blocks.tool(call)
    return out


async def stream_body(
    pipeline: Pipeline,
    prep: Prepared,
    events: Any,
    first: StreamEvent | None,
    tokenizer: Any,
    model: str,
) -> AsyncIterator[bytes]:
    """Anthropic's event sequence; the record is durable before ``message_delta``."""
    yield _event(
        {
            "type": "message_start",
            "message": {
                "id": prep.interaction_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage(prep, 0),
            },
        }
    )
    yield _event({"type": "ping"})
    blocks = _Blocks()
    finished: Completion | None = None
    last_ping = time.monotonic()

    try:
        async with contextlib.aclosing(replay(first, events)) as evs:
            async for ev in evs:
                for chunk in event_bytes(ev, blocks):
                    yield chunk
                if ev.finished:
                    finished = ev.finished
                if time.monotonic() - last_ping > 10:
                    last_ping = time.monotonic()
                    yield _event({"type": "ping"})
    except APIError as e:
        kind = "overloaded_error" if e.status in (429, 503) else "api_error"
        yield _event({"type": "error", "error": {"type": kind, "message": e.message}})
        return
    if finished is None:  # pragma: no cover - the pipeline always ends with a final event
        yield _event({"type": "error", "error": {"type": "api_error", "message": "no output"}})
        return
    if blocks.index < 0:  # nothing was generated: still one (empty) text block
        for chunk in blocks.start({"type": "text", "text": ""}):
            yield chunk
    for chunk in blocks.close():
        yield chunk
    # the record is durable before the client sees the end of the message
    await pipeline.record(prep, [finished])
    reason, seq = stop_info(prep, finished, tokenizer, pipeline.renderer.context_length)
    yield _event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": {"output_tokens": len(finished.output_ids)},
        }
    )
    yield _event({"type": "message_stop"})


# ---- models -------------------------------------------------------------------------

MODEL_CREATED_AT = "2025-01-01T00:00:00Z"


def model_entry(name: str) -> dict[str, Any]:
    return {"type": "model", "id": name, "display_name": name, "created_at": MODEL_CREATED_AT}


def models_body(name: str) -> dict[str, Any]:
    return {"data": [model_entry(name)], "has_more": False, "first_id": name, "last_id": name}
