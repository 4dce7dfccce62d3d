"""OpenAI Responses: a thin translator to and from the internal request type.

- ``input`` (a string, or items: ``message``, ``function_call``, ``function_call_output``;
  ``reasoning`` items are accepted and skipped) -> messages; ``instructions`` -> a system
  message first (instructions are not carried over from a previous response, as OpenAI
  documents);
- ``previous_response_id``: the routes rebuild the earlier conversation from the recorded
  interactions and hand it in as ``history``;
- function ``tools`` -> tools; ``tool_choice`` auto/none/required/{function}.

Token ids and logprobs never pass through here; the Pipeline records them.
"""

from __future__ import annotations

import contextlib
import json
import secrets
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
from gateway.structured import openai_format

PROTOCOL = "openai-responses"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponsesRequest(_Loose):
    model: str = "rlgate-policy"
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    store: bool | None = True
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    background: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[Any] | None = None
    truncation: str | None = None


# accepted and ignored: they do not change what the model generates here.
# ``client_metadata`` is Codex's (0.17x sends installation/turn/window ids in it with
# every request; the recorded request keeps it as sent).
_IGNORED = {
    "prompt_cache_key",
    "service_tier",
    "safety_identifier",
    "stream_options",
    "client_metadata",
}


def parse(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        req = ResponsesRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise bad_request(f"invalid value for '{loc}': {err['msg']}", loc) from None
    unknown = set(req.model_extra or {}) - _IGNORED
    if "conversation" in unknown:
        raise bad_request(
            "'conversation' is not supported; chain calls with previous_response_id",
            "conversation",
        )
    if unknown:
        raise bad_request(
            f"unsupported parameter(s): {', '.join(sorted(unknown))}", sorted(unknown)[0]
        )
    if req.background:
        raise bad_request("background responses are not supported; remove it", "background")
    openai_format((req.text or {}).get("format"), "text.format", nested=False)  # checked early
    if req.truncation not in (None, "disabled", "auto"):
        raise bad_request("truncation must be 'disabled' or 'auto'", "truncation")
    if isinstance(req.input, list) and not req.input and not req.previous_response_id:
        raise bad_request("input must not be empty", "input")
    return req


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", where)
    parts = []
    for i, part in enumerate(content):
        w = f"{where}[{i}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"{w} must be a content part object with a 'type'", w)
        kind = part["type"]
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{w}.text must be a string", f"{w}.text")
            parts.append(part["text"])
        elif kind == "refusal":
            parts.append(str(part.get("refusal") or ""))
        elif kind in ("input_image", "input_file", "input_audio", "image_url"):
            raise bad_request(
                f"{w} is an {kind} part, but the served model reads text only; send text",
                w,
            )
        else:
            raise bad_request(f"{w} has unknown content part type {kind!r}", w)
    return "".join(parts)


def parse_input(items: str | list[Any], where: str = "input") -> list[Message]:
    if isinstance(items, str):
        return [Message("user", items)]
    out: list[Message] = []
    for i, item in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{w} must be an object", w)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role
            if role not in ("system", "user", "assistant"):
                raise bad_request(
                    f"{w}.role must be one of user, assistant, system, developer (got "
                    f"{item.get('role')!r})",
                    f"{w}.role",
                )
            out.append(Message(role, _content(item.get("content"), f"{w}.content")))
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise bad_request(f"{w} (function_call) needs string 'call_id' and 'name'", w)
            if args is None:
                args = "{}"
            if not isinstance(args, str):
                args = json.dumps(args)
            call = ToolCallOut(call_id, name, args)
            if out and out[-1].role == "assistant":
                out[-1].tool_calls.append(call)
            else:
                out.append(Message("assistant", "", [call]))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(
                    f"{w}.call_id is required for a function_call_output", f"{w}.call_id"
                )
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{w}.output")
            out.append(Message("tool", text, tool_call_id=call_id))
        elif kind == "reasoning":
            continue  # reasoning of an earlier turn is not re-rendered into the prompt
        else:
            raise bad_request(
                f"{w} has type {kind!r}; supported input items are message, function_call, "
                "function_call_output and reasoning",
                f"{w}.type",
            )
    return out


def namespaces(raw: Any) -> dict[str, str]:
    """Function name -> its namespace, for the functions of ``namespace`` tools."""
    out: dict[str, str] = {}
    for t in raw if isinstance(raw, list) else []:
        if isinstance(t, dict) and t.get("type") == "namespace":
            for f in t.get("tools") or []:
                if isinstance(f, dict) and isinstance(f.get("name"), str):
                    out.setdefault(f["name"], str(t.get("name")))
    return out


def parse_tools(raw: list[Any] | None, where_prefix: str = "tools") -> list[Tool]:
    """Function tools; a ``namespace`` tool (a named group of functions; Codex sends its
    sub-agent tools as one) contributes its functions by their own names, and calls of
    them come back with the ``namespace`` field set."""
    tools: list[Tool] = []
    for i, t in enumerate(raw or []):
        where = f"{where_prefix}[{i}]"
        if isinstance(t, dict) and t.get("type") == "namespace" and where_prefix == "tools":
            if not isinstance(t.get("name"), str) or not TOOL_NAME.match(t["name"]):
                raise bad_request(
                    f"{where}.name must match ^[A-Za-z0-9_-]{{1,64}}$", f"{where}.name"
                )
            if not isinstance(t.get("tools"), list):
                raise bad_request(f"{where}.tools must be a list of function tools", where)
            tools += parse_tools(t["tools"], f"{where}.tools")
            continue
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad_request(
                f"{where} is a {kind!r} tool; only 'function' and 'namespace' tools are "
                "supported (hosted tools such as web_search run at OpenAI, not here)",
                f"{where}.type",
            )
        name = t.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise bad_request(f"{where}.name must match ^[A-Za-z0-9_-]{{1,64}}$", f"{where}.name")
        params = t.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise bad_request(
                f"{where}.parameters must be a JSON Schema object", f"{where}.parameters"
            )
        try:
            jsonschema.Draft202012Validator.check_schema(params)
        except jsonschema.SchemaError as e:
            raise bad_request(
                f"{where}.parameters is not a valid JSON Schema: {e.message}",
                f"{where}.parameters",
            ) from None
        tools.append(Tool(name, str(t.get("description") or ""), params))
    return tools


def _tool_choice(choice: Any, tools: list[Tool]) -> tuple[Any, list[Tool]]:
    if choice is None or choice == "auto":
        return "auto", tools
    if choice == "none":
        return "none", tools
    if choice == "required":
        if not tools:
            raise bad_request("tool_choice 'required' needs tools", "tool_choice")
        return "required", tools
    if isinstance(choice, dict) and choice.get("type") == "function":
        picked = [t for t in tools if t.name == choice.get("name")]
        if not picked:
            raise bad_request("tool_choice names a function that is not in tools", "tool_choice")
        return "required", picked
    raise bad_request(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
    )


def to_internal(
    req: ResponsesRequest, body: dict[str, Any], history: list[Message], session_hint: str | None
) -> GenerationRequest:
    messages = list(history)
    messages += parse_input(req.input)
    if req.instructions:
        messages.insert(0, Message("system", req.instructions))
    if not any(m.role != "system" for m in messages):
        raise bad_request("input has no message for the model to answer", "input")
    tools = parse_tools(req.tools)
    tool_choice, tools = _tool_choice(req.tool_choice, tools)
    sampling = Sampling(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=req.max_output_tokens,
        json_schema=openai_format((req.text or {}).get("format"), "text.format", nested=False),
    )
    return GenerationRequest(
        protocol=PROTOCOL,
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling,
        stream=req.stream,
        include_usage=True,
        user=req.user,
        metadata=req.metadata or {},
        session_hint=session_hint,
        raw=body,
    )


def history_turn(request: dict[str, Any], output: dict[str, Any]) -> list[Message]:
    """The messages one recorded response adds to a conversation: its input, its answer."""
    msgs = parse_input(request.get("input", []))
    calls = [
        ToolCallOut(str(c.get("id", "")), str(c.get("name", "")), str(c.get("arguments", "{}")))
        for c in output.get("tool_calls") or []
    ]
    msgs.append(Message("assistant", output.get("text") or "", calls, reasoning=None))
    return msgs


# ---- responses ----------------------------------------------------------------------


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def call_item(
    item_id: str, call: ToolCallOut, status: str = "completed", ns: dict[str, str] | None = None
) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }
    if ns and call.name in ns:
        item["namespace"] = ns[call.name]
    return item


def output_items(c: Completion, ns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if c.reasoning is not None:
        items.append(reasoning_item(_id("rs"), c.reasoning))
    if c.content or not c.tool_calls:
        items.append(message_item(_id("msg"), c.content or ""))
    items += [call_item(_id("fc"), t, ns=ns) for t in c.tool_calls]
    return items


def response_object(
    prep: Prepared,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    completion: Completion | None,
    created: int,
) -> dict[str, Any]:
    s = prep.req.sampling
    return stored_object(
        prep.interaction_id,
        prep.req.raw,
        (s.temperature, s.top_p),
        len(prep.prompt_ids),
        model,
        status,
        output,
        completion,
        created,
    )


def stored_object(
    rid: str,
    raw: dict[str, Any],
    temperature_top_p: tuple[float, float],
    prompt_tokens: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    completion: Completion | None,
    created: int,
) -> dict[str, Any]:
    """The Response object (also for a stored response rebuilt from its record)."""
    out_tokens = len(completion.output_ids) if completion else 0
    # "incomplete" means the client's own max_output_tokens was reached. A client that set
    # none (Codex sets none) gets "completed" when the gateway's RLGATE_DEFAULT_MAX_TOKENS
    # or the model's context cut the answer; the record keeps finish_reason "length".
    incomplete = (
        completion is not None
        and completion.finish_reason == "length"
        and raw.get("max_output_tokens") is not None
    )
    if incomplete and status == "completed":
        status = "incomplete"
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": raw.get("instructions"),
        "max_output_tokens": raw.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": raw.get("parallel_tool_calls", True),
        "previous_response_id": raw.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": raw.get("store", True),
        "temperature": temperature_top_p[0],
        "text": raw.get("text") or {"format": {"type": "text"}},
        "tool_choice": raw.get("tool_choice", "auto"),
        "tools": raw.get("tools") or [],
        "top_p": temperature_top_p[1],
        "truncation": raw.get("truncation") or "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": completion.cached_tokens if completion else 0,
                "cache_write_tokens": 0,
            },
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + out_tokens,
        },
        "user": raw.get("user"),
        "metadata": raw.get("metadata") or {},
    }


def response_body(prep: Prepared, c: Completion, model: str) -> dict[str, Any]:
    items = output_items(c, namespaces(prep.req.raw.get("tools")))
    return response_object(prep, model, "completed", items, c, int(time.time()))


# ---- streaming ----------------------------------------------------------------------


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
        data = json.dumps(obj, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

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

    def _start(self, kind: str) -> list[bytes]:
        out = self.close()
        if kind == "message":
            item = message_item(_id("msg"), "", "in_progress")
            item["content"] = []
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = reasoning_item(_id("rs"), "")
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
        out = [] if self.open == kind else self._start(kind)
        self.text += text
        ref = {"item_id": self.items[-1]["id"], "output_index": self.index, "content_index": 0}
        if kind == "message":
            out.append(self.ev("response.output_text.delta", **ref, delta=text, logprobs=[]))
        else:
            out.append(self.ev("response.reasoning_text.delta", **ref, delta=text))
        return out

    def call(self, call: ToolCallOut) -> list[bytes]:
        out = self.close()
        item_id = _id("fc")
        added = call_item(item_id, call, "in_progress", self.ns)
        added["arguments"] = ""
        self.items.append(call_item(item_id, call, ns=self.ns))
        ref = {"item_id": item_id, "output_index": self.index}
        out.append(self.ev("response.output_item.added", output_index=self.index, item=added))
        out.append(self.ev("response.function_call_arguments.delta", **ref, delta=call.arguments))
        out.append(
            self.ev(
                "response.function_call_arguments.done",
                **ref,
                name=call.name,
                arguments=call.arguments,
            )
        )
        out.append(
            self.ev("response.output_item.done", output_index=self.index, item=self.items[-1])
        )
        return out


def event_bytes(ev: StreamEvent, items: _Items) -> list[bytes]:
    out: list[bytes] = []
    if ev.reasoning:
        out += items.delta("reasoning", ev.reasoning)
    if ev.content:
        out += items.delta("message", ev.content)
    for call in ev.tool_calls:
        out += items.call(call)
    return out


async def stream_body(
    pipeline: Pipeline,
    prep: Prepared,
    events: Any,
    first: StreamEvent | None,
    model: str,
    on_recorded: Any = None,
) -> AsyncIterator[bytes]:
    """OpenAI's Responses event sequence; the record is durable before the final event."""
    created = int(time.time())
    items = _Items(namespaces(prep.req.raw.get("tools")))
    start = response_object(prep, model, "in_progress", [], None, created)
    yield items.ev("response.created", response=start)
    yield items.ev("response.in_progress", response=start)
    finished: Completion | None = None

    try:
        async with contextlib.aclosing(replay(first, events)) as evs:
            async for ev in evs:
                for chunk in event_bytes(ev, items):
                    yield chunk
                if ev.finished:
                    finished = ev.finished
    except APIError as e:
        failed = response_object(prep, model, "failed", items.items, None, created)
        failed["error"] = {"code": "server_error", "message": e.message}
        yield items.ev("response.failed", response=failed)
        return
    if finished is None:  # pragma: no cover - the pipeline always ends with a final event
        return
    if not items.items:  # nothing generated: still one (empty) message
        for chunk in items._start("message"):
            yield chunk
    for chunk in items.close():
        yield chunk
    await pipeline.record(prep, [finished])
    if on_recorded is not None:
        on_recorded(finished)
    final = response_object(prep, model, "completed", items.items, finished, created)
    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
    yield items.ev(kind, response=final)
