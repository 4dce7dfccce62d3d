"""OpenAI Chat Completions <-> the internal request: a body to a ``GenerationRequest``,
``Completion``s to a ``chat.completion``, a stored request to the dashboard's messages."""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.api import base
from gateway.api.openai_chat.protocol import (
    IGNORED,
    REFUSED,
    ChatRequest,
    calls_usage,
    tool_call_json,
)
from gateway.call.pipeline import Prepared
from gateway.call.request import (
    Completion,
    GenerationRequest,
    Message,
    Sampling,
    Tool,
    ToolCallOut,
)
from gateway.call.structured import openai_format
from gateway.call.templating import check_template_kwargs
from gateway.edge.errors import bad_request
from schemas.atdp import ClientProtocol

PROTOCOL = ClientProtocol.openai_chat
ID_PREFIX = "chatcmpl-"
_TEXT_PARTS = ("text", "input_text", "output_text")
_MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "file")


def _part_text(part: Any, w: str, where: str) -> str:
    """One content part's text; its errors name the whole content (``where``) as param."""
    if not isinstance(part, dict) or "type" not in part:
        raise bad_request(f"{w} must be a content part object with a 'type'", where)
    kind = part["type"]
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return part["text"]
    if kind in _TEXT_PARTS:
        raise bad_request(f"{w}.text must be a string", where)
    if kind in _MEDIA_PARTS:
        raise bad_request(
            f"{w} is a {kind} part, but the served model reads text only; send text content",
            where,
        )
    raise bad_request(f"{w} has unknown content part type {kind!r}", where)


def _text(raw: Any, where: str) -> str:
    return base.join_parts(raw, where, lambda part, w: _part_text(part, w, where))


def _tool_calls(m: dict[str, Any], where: str) -> list[ToolCallOut]:
    if not isinstance(m["tool_calls"], list):
        raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    calls = []
    for j, c in enumerate(m["tool_calls"]):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}.tool_calls[{j}] needs function.name", f"{where}.tool_calls")
        args = fn.get("arguments", "{}")
        args = args if isinstance(args, str) else json.dumps(args)
        calls.append(ToolCallOut(str(c.get("id", "")), fn["name"], args))
    return calls


def parse_messages(raw: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(
                f"{where}.role must be one of system, developer, user, assistant, "
                f"tool (got {role!r})",
                f"{where}.role",
            )
        content = _text(m.get("content"), f"{where}.content")
        calls: list[ToolCallOut] = []
        if role == "assistant" and m.get("tool_calls"):
            calls = _tool_calls(m, where)
        elif role == "user" and m.get("content") is None:
            raise bad_request(f"{where}.content is required for a user message", f"{where}.content")
        tool_call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(tool_call_id, str):
            raise bad_request(
                f"{where}.tool_call_id is required for a tool message", f"{where}.tool_call_id"
            )
        out.append(
            Message(
                role=role,
                content=content,
                tool_calls=calls,
                tool_call_id=tool_call_id,
                name=m.get("name"),
            )
        )
    return out


def parse_tools(raw: list[dict[str, Any]] | None) -> list[Tool]:
    tools: list[Tool] = []
    for i, t in enumerate(raw or []):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise bad_request(f"{where}.type must be 'function'", where)
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"{where}.function must be an object", where)
        tools.append(
            base.function_tool(
                fn.get("name"),
                fn.get("description"),
                fn.get("parameters", {"type": "object", "properties": {}}),
                name_at=f"{where}.function.name",
                schema_at=f"{where}.function.parameters",
            )
        )
    return tools


def _tool_choice(req: ChatRequest, tools: list[Tool]) -> tuple[str | dict[str, Any], list[Tool]]:
    choice = req.tool_choice or "auto"
    if isinstance(choice, dict):  # passed on as it is, with the one tool it names
        name = (choice.get("function") or {}).get("name")
        return choice, base.choose_tools("named", tools, picked=name)[1]
    return base.choose_tools(choice, tools)


def _sampling(req: ChatRequest, json_schema: str | None) -> Sampling:
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs: true", "top_logprobs")
    stop = base.seed_and_stop(req.seed, req.n, req.stop)
    return Sampling(
        values=base.call_values(req, PROTOCOL),
        max_tokens=req.max_completion_tokens or req.max_tokens,
        stop=stop,
        seed=req.seed,
        n=req.n,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs or 0,
        json_schema=json_schema,
    )


def to_internal(body: Any, session_header: str | None) -> GenerationRequest:
    req = base.validate(ChatRequest, body)
    json_schema = openai_format(req.response_format, "response_format", nested=True)
    if req.logit_bias:
        raise bad_request("logit_bias is not supported; remove it", "logit_bias")
    base.reject_unknown(req, IGNORED, REFUSED)
    choice = _tool_choice(req, parse_tools(req.tools))
    sampling = _sampling(req, json_schema)
    messages = parse_messages(req.messages)
    fields = {
        "include_usage": bool((req.stream_options or {}).get("include_usage")),
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "chat_template_kwargs": check_template_kwargs(req.chat_template_kwargs),
        "user": req.user,
        "metadata": req.metadata or {},
        "session_hint": session_header,
        "return_token_ids": req.return_token_ids,
    }
    return base.internal_request(PROTOCOL, req, body, messages, choice, sampling, **fields)


def display_messages(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored request's conversation as the dashboard shows it."""
    return base.display_or_raw(
        lambda: parse_messages(raw.get("messages") or []), raw.get("messages")
    )


# ---- answers ------------------------------------------------------------------------


def logprobs_content(
    tokenizer: Any, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]] | None
) -> list[dict[str, Any]]:
    out = []
    for k, (tid, lp) in enumerate(zip(ids, lps, strict=True)):
        tok = tokenizer.decode([tid])
        entry = {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
        if tops and k < len(tops):
            for t_id, t_lp in tops[k]:
                t_tok = tokenizer.decode([t_id])
                entry["top_logprobs"].append(
                    {"token": t_tok, "logprob": t_lp, "bytes": list(t_tok.encode())}
                )
        out.append(entry)
    return out


def response_body(
    prep: Prepared, completions: list[Completion], tokenizer: Any, model: str
) -> dict[str, Any]:
    choices = []
    for c in completions:
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.reasoning is not None:
            message["reasoning_content"] = c.reasoning
        if c.tool_calls:
            message["tool_calls"] = [tool_call_json(t) for t in c.tool_calls]
        choice: dict[str, Any] = {
            "index": c.index,
            "message": message,
            "finish_reason": c.finish_reason,
            "logprobs": None,
        }
        if prep.req.return_token_ids:
            choice["token_ids"] = c.output_ids
        if prep.req.sampling.logprobs:
            choice["logprobs"] = {
                "content": logprobs_content(tokenizer, c.output_ids, c.logprobs, c.top_logprobs)
            }
        choices.append(choice)
    return {
        "id": prep.interaction_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": calls_usage([(len(prep.prompt_ids), completions)]),
        "system_fingerprint": prep.policy_version,
        **base.token_ids(prep),
    }
