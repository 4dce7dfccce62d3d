"""OpenAI Chat Completions: a thin translator to and from the internal request type."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import APIError
from gateway.errors import bad_request
from gateway.request import (
    Completion,
    GenerationRequest,
    Message,
    Sampling,
    Tool,
    ToolCallOut,
)
from gateway.service import Pipeline, Prepared, StreamEvent, replay
from gateway.structured import openai_format
from gateway.templating import check_template_kwargs

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_N = 8
# The engines' seed range (64-bit signed, SGLang's and the embedded engine's); choice i of
# n is sampled with seed + i, so that must fit too.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatRequest(_Loose):
    model: str = "rlgate-policy"
    messages: list[dict[str, Any]] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None


# accepted and ignored: they do not change what the model generates
_IGNORED = {
    "store",
    "service_tier",
    "reasoning_effort",
    "prediction",
    "web_search_options",
    "modalities",
    "top_k",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
}


def _validation_message(e: ValidationError) -> tuple[str, str]:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"invalid value for '{loc}': {err['msg']}", loc


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise bad_request(
                    f"{where}[{i}] must be a content part object with a 'type'", where
                )
            kind = part["type"]
            if kind in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise bad_request(f"{where}[{i}].text must be a string", where)
                parts.append(part["text"])
            elif kind in ("image_url", "input_image", "image", "input_audio", "file"):
                raise bad_request(
                    f"{where}[{i}] is a {kind} part, but the served model reads "
                    "text only; send text content",
                    where,
                )
            else:
                raise bad_request(f"{where}[{i}] has unknown content part type {kind!r}", where)
        return "".join(parts)
    raise bad_request(f"{where} must be a string or a list of content parts", where)


def parse_messages(raw: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(
                f"{where}.role must be one of system, developer, user, assistant, "
                f"tool (got {role!r})",
                f"{where}.role",
            )
        content = _text(m.get("content"), f"{where}.content")
        calls: list[ToolCallOut] = []
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
            for j, c in enumerate(m["tool_calls"]):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad_request(
                        f"{where}.tool_calls[{j}] needs function.name", f"{where}.tool_calls"
                    )
                args = fn.get("arguments", "{}")
                calls.append(
                    ToolCallOut(
                        str(c.get("id", "")),
                        fn["name"],
                        args if isinstance(args, str) else json.dumps(args),
                    )
                )
        elif role == "user" and m.get("content") is None:
            raise bad_request(f"{where}.content is required for a user message", f"{where}.content")
        tool_call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(tool_call_id, str):
            raise bad_request(
                f"{where}.tool_call_id is required for a tool message", f"{where}.tool_call_id"
            )
        out.append(Message(role, content, calls, tool_call_id, m.get("name")))
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
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise bad_request(
                f"{where}.function.name must match ^[A-Za-z0-9_-]{{1,64}}$",
                f"{where}.function.name",
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad_request(
                f"{where}.function.parameters must be a JSON Schema object",
                f"{where}.function.parameters",
            )
        try:
            jsonschema.Draft202012Validator.check_schema(params)
        except jsonschema.SchemaError as e:
            raise bad_request(
                f"{where}.function.parameters is not a valid JSON Schema: {e.message}",
                f"{where}.function.parameters",
            ) from None
        tools.append(Tool(name, str(fn.get("description") or ""), params))
    return tools


def to_internal(body: Any, session_header: str | None) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as e:
        msg, loc = _validation_message(e)
        raise bad_request(msg, loc) from None
    json_schema = openai_format(req.response_format, "response_format", nested=True)
    if req.logit_bias:
        raise bad_request("logit_bias is not supported; remove it", "logit_bias")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name):
            raise bad_request(f"{name} is not supported; remove it or set it to 0", name)
    unknown = set(req.model_extra or {}) - _IGNORED
    if "functions" in unknown or "function_call" in unknown:
        raise bad_request("'functions'/'function_call' are deprecated; use 'tools'", "functions")
    if unknown:
        raise bad_request(
            f"unsupported parameter(s): {', '.join(sorted(unknown))}", sorted(unknown)[0]
        )
    tools = parse_tools(req.tools)
    tool_choice: str | dict[str, Any] = req.tool_choice or "auto"
    if isinstance(tool_choice, dict):
        fname = (tool_choice.get("function") or {}).get("name")
        if fname not in {t.name for t in tools}:
            raise bad_request("tool_choice names a function that is not in tools", "tool_choice")
        tools = [t for t in tools if t.name == fname]
    if tool_choice == "required" and not tools:
        raise bad_request("tool_choice 'required' needs tools", "tool_choice")
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs: true", "top_logprobs")
    if req.seed is not None and not SEED_MIN <= req.seed <= SEED_MAX - (req.n - 1):
        raise bad_request(
            f"invalid value for 'seed': must be an integer in [{SEED_MIN}, "
            f"{SEED_MAX - (req.n - 1)}] (a 64-bit signed integer; choice i uses seed + i)",
            "seed",
        )
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4:
        raise bad_request("stop may hold at most 4 sequences", "stop")
    sampling = Sampling(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        stop=stop,
        seed=req.seed,
        n=req.n,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs or 0,
        json_schema=json_schema,
    )
    metadata = req.metadata or {}
    return GenerationRequest(
        protocol="openai-chat",
        model=req.model,
        messages=parse_messages(req.messages),
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling,
        stream=req.stream,
        include_usage=bool((req.stream_options or {}).get("include_usage")),
        chat_template_kwargs=check_template_kwargs(req.chat_template_kwargs),
        user=req.user,
        metadata=metadata,
        session_hint=session_header,
        raw=body,
    )


# ---- responses ----------------------------------------------------------------------


def _logprobs_content(
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


def _tool_calls_json(calls: list[ToolCallOut]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def response_body(
    prep: Prepared, completions: list[Completion], tokenizer: Any, model: str
) -> dict[str, Any]:
    choices = []
    for c in completions:
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.reasoning is not None:
            message["reasoning_content"] = c.reasoning
        if c.tool_calls:
            message["tool_calls"] = _tool_calls_json(c.tool_calls)
        choice: dict[str, Any] = {
            "index": c.index,
            "message": message,
            "finish_reason": c.finish_reason,
            "logprobs": None,
        }
        if prep.req.sampling.logprobs:
            choice["logprobs"] = {
                "content": _logprobs_content(tokenizer, c.output_ids, c.logprobs, c.top_logprobs)
            }
        choices.append(choice)
    completion_tokens = sum(len(c.output_ids) for c in completions)
    return {
        "id": prep.interaction_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prep.prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prep.prompt_ids) + completion_tokens,
        },
        "system_fingerprint": prep.policy_version,
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def stream_body(
    pipeline: Pipeline,
    prep: Prepared,
    events: Any,
    first: StreamEvent | None,
    tokenizer: Any,
    model: str,
) -> AsyncIterator[bytes]:
    created = int(time.time())
    base = {
        "id": prep.interaction_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": prep.policy_version,
    }
    n = prep.req.sampling.n
    tool_index = [0] * n
    for i in range(n):
        yield _sse(
            {
                **base,
                "choices": [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
    finished: list[Completion] = []

    try:
        async with contextlib.aclosing(replay(first, events)) as evs:
            async for ev in evs:
                for chunk in _event_chunks(ev, base, prep, tokenizer, tool_index):
                    yield _sse(chunk)
                if ev.finished:
                    finished.append(ev.finished)
    except APIError as e:
        yield _sse({"error": {"message": e.message, "type": "server_error", "code": e.status}})
        return
    finished.sort(key=lambda c: c.index)
    # the record is durable before the client sees the end of the stream
    await pipeline.record(prep, finished)
    if prep.req.include_usage:
        ct = sum(len(c.output_ids) for c in finished)
        yield _sse(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prep.prompt_ids),
                    "completion_tokens": ct,
                    "total_tokens": len(prep.prompt_ids) + ct,
                },
            }
        )
    yield b"data: [DONE]\n\n"


def _event_chunks(
    ev: StreamEvent, base: dict[str, Any], prep: Prepared, tokenizer: Any, tool_index: list[int]
) -> list[dict[str, Any]]:
    chunks = []
    delta: dict[str, Any] = {}
    if ev.reasoning:
        delta["reasoning_content"] = ev.reasoning
    if ev.content:
        delta["content"] = ev.content
    logprobs = None
    if prep.req.sampling.logprobs and ev.new_ids:
        logprobs = {
            "content": _logprobs_content(tokenizer, ev.new_ids, ev.new_logprobs, ev.new_top or None)
        }
    if delta or logprobs:
        chunks.append(
            {
                **base,
                "choices": [
                    {"index": ev.index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
                ],
            }
        )
    for call in ev.tool_calls:
        k = tool_index[ev.index]
        tool_index[ev.index] += 1
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": ev.index,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": k,
                                    "id": call.id,
                                    "type": "function",
                                    "function": {"name": call.name, "arguments": call.arguments},
                                }
                            ]
                        },
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
    if ev.finished:
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": ev.index,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": ev.finished.finish_reason,
                    }
                ],
            }
        )
    return chunks
