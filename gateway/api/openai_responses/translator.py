"""OpenAI Responses <-> the internal request type.

- ``input`` (a string, or items: ``message``, ``function_call``, ``function_call_output``,
  ``custom_tool_call``, ``custom_tool_call_output``; ``reasoning`` items are accepted and
  skipped) -> messages; ``instructions`` -> a system
  message first (instructions are not carried over from a previous response, as OpenAI
  documents);
- ``previous_response_id``: the router rebuilds the earlier conversation from the recorded
  interactions (``store.py``) and hands it in as ``history``; with ``conversation`` the
  history is the conversation's items (``conversations.py``);
- function, ``namespace`` and ``custom`` ``tools`` -> tools (gateway/call/custom_tools.py);
  ``tool_choice`` auto/none/required/{function}/{custom}.

Token ids and logprobs never pass through here; the Pipeline records them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.api import base
from gateway.api.openai_responses.protocol import (
    IGNORED,
    REFUSED,
    ResponsesRequest,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    response_json,
)
from gateway.call.custom_tools import custom_tool
from gateway.call.generation import read_stored_call
from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest, Message, Sampling, Tool, ToolCallOut
from gateway.call.structured import openai_format
from gateway.edge.errors import bad_request
from schemas.atdp import ClientProtocol

PROTOCOL = ClientProtocol.openai_responses
ID_PREFIX = "resp_"


def parse(body: Any) -> ResponsesRequest:
    req = base.validate(ResponsesRequest, body)
    base.reject_unknown(req, IGNORED, REFUSED)
    if req.background:
        raise bad_request("background responses are not supported; remove it", "background")
    openai_format((req.text or {}).get("format"), "text.format", nested=False)  # checked early
    if req.truncation not in (None, "disabled", "auto"):
        raise bad_request("truncation must be 'disabled' or 'auto'", "truncation")
    if req.conversation is not None and req.previous_response_id:
        raise bad_request(
            "conversation and previous_response_id cannot be used together; send one",
            "conversation",
        )
    continued = req.previous_response_id or req.conversation is not None
    if isinstance(req.input, list) and not req.input and not continued:
        raise bad_request("input must not be empty", "input")
    return req


def _part_text(part: Any, w: str) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise bad_request(f"{w} must be a content part object with a 'type'", w)
    kind = part["type"]
    if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{w}.text must be a string", f"{w}.text")
        return part["text"]
    if kind == "refusal":
        return str(part.get("refusal") or "")
    if kind in ("input_image", "input_file", "input_audio", "image_url"):
        raise bad_request(
            f"{w} is an {kind} part, but the served model reads text only; send text", w
        )
    raise bad_request(f"{w} has unknown content part type {kind!r}", w)


def _content(raw: Any, where: str) -> str:
    return base.join_parts(raw, where, _part_text)


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
        elif kind in ("function_call", "custom_tool_call"):
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise bad_request(f"{w} ({kind}) needs string 'call_id' and 'name'", w)
            if kind == "custom_tool_call":
                if not isinstance(item.get("input"), str):
                    raise bad_request(f"{w}.input must be a string", f"{w}.input")
                call = ToolCallOut(call_id, name, item["input"], custom=True)
            else:
                args = item.get("arguments")
                args = "{}" if args is None else args
                call = ToolCallOut(
                    call_id, name, args if isinstance(args, str) else json.dumps(args)
                )
            if out and out[-1].role == "assistant":
                out[-1].tool_calls.append(call)
            else:
                out.append(Message("assistant", "", tool_calls=[call]))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{w}.call_id is required for a {kind}", f"{w}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{w}.output")
            out.append(Message("tool", text, tool_call_id=call_id))
        elif kind == "reasoning":
            continue  # reasoning of an earlier turn is not re-rendered into the prompt
        else:
            raise bad_request(
                f"{w} has type {kind!r}; supported input items are message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output and reasoning",
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
    """Function and custom tools; a ``namespace`` tool (a named group of functions; Codex sends its
    sub-agent tools as one) contributes its functions by their own names, and calls of
    them come back with the ``namespace`` field set."""
    tools: list[Tool] = []
    for i, t in enumerate(raw or []):
        where = f"{where_prefix}[{i}]"
        if isinstance(t, dict) and t.get("type") == "namespace" and where_prefix == "tools":
            base.check_tool_name(t.get("name"), f"{where}.name")
            if not isinstance(t.get("tools"), list):
                raise bad_request(f"{where}.tools must be a list of function tools", where)
            tools += parse_tools(t["tools"], f"{where}.tools")
            continue
        if isinstance(t, dict) and t.get("type") == "custom" and where_prefix == "tools":
            tools.append(custom_tool(t, where, base.check_tool_name))
            continue
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad_request(
                f"{where} is a {kind!r} tool; only 'function', 'custom' and 'namespace' tools "
                "are supported (hosted tools such as web_search run at OpenAI, not here)",
                f"{where}.type",
            )
        tools.append(
            base.function_tool(
                t.get("name"),
                t.get("description"),
                t.get("parameters") or {"type": "object", "properties": {}},
                name_at=f"{where}.name",
                schema_at=f"{where}.parameters",
            )
        )
    return tools


def _tool_choice(choice: Any, tools: list[Tool]) -> tuple[Any, list[Tool]]:
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        kind = choice["type"]
        of_kind = [t for t in tools if (t.custom is not None) == (kind == "custom")]
        return base.choose_tools(
            "named", of_kind, picked=choice.get("name"), named=(f"{kind} tool", "tool_choice")
        )
    if choice is None or choice in ("auto", "none", "required"):
        return base.choose_tools(choice, tools)
    raise bad_request(
        "tool_choice must be 'auto', 'none', 'required', {'type': 'function', 'name': ...} "
        "or {'type': 'custom', 'name': ...}",
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
    choice = _tool_choice(req.tool_choice, tools)
    sampling = Sampling(
        values=base.call_values(req, PROTOCOL),
        max_tokens=req.max_output_tokens,
        json_schema=openai_format((req.text or {}).get("format"), "text.format", nested=False),
    )
    fields = {
        "include_usage": True,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "user": req.user,
        "metadata": req.metadata or {},
        "session_hint": session_hint,
        "return_token_ids": req.return_token_ids,
    }
    return base.internal_request(PROTOCOL, req, body, messages, choice, sampling, **fields)


def history_turn(request: dict[str, Any], output: dict[str, Any]) -> list[Message]:
    """The messages one recorded response adds to a conversation: its input, its answer."""
    msgs = parse_input(request.get("input", []))
    calls = [read_stored_call(c) for c in output.get("tool_calls") or []]
    msgs.append(Message("assistant", output.get("text") or "", tool_calls=calls, reasoning=None))
    return msgs


def display_messages(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored request's conversation (``instructions`` first) as the dashboard shows it;
    a continued response shows its own input, not what ``previous_response_id`` adds."""

    def parse() -> list[Message]:
        messages = parse_input(raw.get("input") or [])
        if raw.get("instructions"):
            messages.insert(0, Message("system", str(raw["instructions"])))
        return messages

    return base.display_or_raw(parse, raw.get("input"))


# ---- answers ------------------------------------------------------------------------


def output_items(c: Completion, ns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if c.reasoning is not None:
        items.append(reasoning_item(new_id("rs"), c.reasoning))
    if c.content or not c.tool_calls:
        items.append(message_item(new_id("msg"), c.content or ""))
    items += [call_item(new_id("ctc" if t.custom else "fc"), t, ns=ns) for t in c.tool_calls]
    return items


def response_object(prep: Prepared, **state: Any) -> dict[str, Any]:
    """The Response object of a call being answered; ``state`` is the rest of
    ``response_json``'s fields (model, status, output, completion, created)."""
    s = prep.req.sampling
    body = response_json(
        rid=prep.interaction_id,
        raw=prep.req.raw,
        temperature=s.values["temperature"],
        top_p=s.values["top_p"],
        prompt_tokens=len(prep.prompt_ids),
        **state,
    )
    return {**body, **base.token_ids(prep, state.get("completion"))}


def response_body(prep: Prepared, c: Completion, model: str) -> dict[str, Any]:
    items = output_items(c, namespaces(prep.req.raw.get("tools")))
    created = int(time.time())
    return response_object(
        prep, model=model, status="completed", output=items, completion=c, created=created
    )


def stored_response(row: Any, model: str) -> dict[str, Any]:
    """A stored response (an ``InteractionRow``) rebuilt as a Response object; its output
    item ids are fresh."""
    out = row.output or {}
    calls = [read_stored_call(t) for t in out.get("tool_calls") or []]
    completion = Completion(
        index=0,
        output_ids=row.completion_token_ids,
        logprobs=row.completion_logprobs,
        top_logprobs=None,
        text=out.get("text") or "",
        content=out.get("text"),
        reasoning=out.get("reasoning"),
        tool_calls=calls,
        finish_reason=row.finish_reason,
        prompt_tokens=len(row.prompt_token_ids),
    )
    return response_json(
        rid=row.id,
        raw=row.request,
        temperature=row.temperature,
        top_p=row.top_p,
        prompt_tokens=len(row.prompt_token_ids),
        model=model,
        status="completed",
        output=output_items(completion, namespaces(row.request.get("tools"))),
        completion=completion,
        created=int(row.created_at.timestamp()),
    )
