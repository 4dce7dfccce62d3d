"""What the four API translators share: request validation and its error messages,
unknown-field rejection, tool-name and tool-schema checks, the internal request, the
dashboard's view of a stored request, SSE encoding and the model-key check. How a call is
served (the route's one call) is ``handler.py``'s."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from gateway.call.pipeline import Prepared
from gateway.call.request import Completion, GenerationRequest, Message, Sampling, Tool
from gateway.edge.auth import require_model_key
from gateway.edge.errors import bad_request
from schemas import sampling_fields

__all__ = ["require_model_key"]

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPENAI_INVALID = "invalid value for '{loc}': {msg}"

M = TypeVar("M", bound=BaseModel)


class Loose(BaseModel):
    """A request model that keeps unknown fields (``model_extra``) for ``reject_unknown``."""

    model_config = ConfigDict(extra="allow")


def with_call_fields(api: str) -> Callable[[type[M]], type[M]]:
    """A request model's class decorator: the model with the sampling fields ``api``
    takes (schemas/sampling_fields.py) added after its own, each null when not sent and
    checked to that API's range (pydantic's messages name the field)."""

    def add(model: type[M]) -> type[M]:
        fields: dict[str, Any] = {
            a.name: (f.type | None, Field(None, ge=a.range.ge, gt=a.range.gt, le=a.range.le))
            for f, a in sampling_fields.of_api(api)
        }
        extended = create_model(  # type: ignore[call-overload]
            model.__name__, __base__=model, __module__=model.__module__, **fields
        )
        extended.__doc__ = model.__doc__
        return extended  # type: ignore[no-any-return]

    return add


# ---- requests ----------------------------------------------------------------------


def validate(model: type[M], body: Any, message: str = OPENAI_INVALID) -> M:
    """The body as ``model``; a 400 naming the first invalid field otherwise (``message``
    is formatted with its ``loc`` and pydantic's ``msg``)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise bad_request(message.format(loc=loc, msg=err["msg"]), loc) from None


def reject_unknown(
    req: Loose, ignored: set[str], refused: dict[str, tuple[str, str]] | None = None
) -> None:
    """A 400 for a field the API model does not know and ``ignored`` does not list:
    ``refused`` names fields with their own message (and param), the rest are listed."""
    unknown = set(req.model_extra or {}) - ignored
    for name, (message, param) in (refused or {}).items():
        if name in unknown:
            raise bad_request(message, param)
    if unknown:
        names = sorted(unknown)
        raise bad_request(f"unsupported parameter(s): {', '.join(names)}", names[0])


def join_parts(raw: Any, where: str, part_text: Callable[[Any, str], str]) -> str:
    """OpenAI message content as text: a string as it is (None is empty), or its content
    parts read by ``part_text(part, where_of_part)`` and joined; a 400 for anything else."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise bad_request(f"{where} must be a string or a list of content parts", where)
    return "".join(part_text(part, f"{where}[{i}]") for i, part in enumerate(raw))


def check_tool_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise bad_request(f"{where} must match ^[A-Za-z0-9_-]{{1,64}}$", where)
    return name


def check_tool_schema(
    schema: Any, where: str, missing: str = "must be a JSON Schema object"
) -> dict[str, Any]:
    """A tool's parameters: a JSON Schema object that is itself valid (draft 2020-12)."""
    if not isinstance(schema, dict):
        raise bad_request(f"{where} {missing}", where)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise bad_request(f"{where} is not a valid JSON Schema: {e.message}", where) from None
    return schema


def function_tool(
    name: Any,
    description: Any,
    schema: Any,
    *,
    name_at: str,
    schema_at: str,
    missing: str = "must be a JSON Schema object",
) -> Tool:
    """One function tool, its name and its parameters checked (400s name where)."""
    name = check_tool_name(name, name_at)
    return Tool(name, str(description or ""), check_tool_schema(schema, schema_at, missing))


def choose_tools(
    mode: str | None,
    tools: list[Tool],
    *,
    picked: Any = None,
    word: str = "required",
    named: tuple[str, str] = ("function", "tool_choice"),
) -> tuple[str, list[Tool]]:
    """An API's ``tool_choice`` in internal terms: ``mode`` auto (or None), none, required
    (the API calls it ``word``) or named (the tool ``picked``; ``named`` is what the API
    calls a tool and where it names one). Returns (tool_choice, the tools offered)."""
    if mode in (None, "auto", "none"):
        return mode or "auto", tools
    if mode == "required":
        if not tools:
            raise bad_request(f"tool_choice '{word}' needs tools", "tool_choice")
        return "required", tools
    chosen = [t for t in tools if t.name == picked]
    if not chosen:
        raise bad_request(f"tool_choice names a {named[0]} that is not in tools", named[1])
    return "required", chosen


# The engines' seed range (64-bit signed, SGLang's and the embedded engine's); choice i of
# n is sampled with seed + i, so that must fit too.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
MAX_STOP = 4  # OpenAI's limit on stop sequences


def seed_and_stop(seed: int | None, n: int, stop: str | list[str] | None) -> list[str]:
    """OpenAI's ``seed`` (checked against the engines' range for ``n`` choices) and
    ``stop`` (one string or up to four) checked; returns the stop sequences as a list."""
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX - (n - 1):
        raise bad_request(
            f"invalid value for 'seed': must be an integer in [{SEED_MIN}, "
            f"{SEED_MAX - (n - 1)}] (a 64-bit signed integer; choice i uses seed + i)",
            "seed",
        )
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP:
        raise bad_request(f"stop may hold at most {MAX_STOP} sequences", "stop")
    return stops


def call_values(req: BaseModel, api: str) -> dict[str, float]:
    """The sampling fields of a request model made ``with_call_fields(api)``, by internal
    name: what the client sent, or the default (not sent, or the field's ``off`` value)."""
    return {f.name: f.from_api(getattr(req, a.name)) for f, a in sampling_fields.of_api(api)}


def internal_request(
    protocol: str,
    req: Any,
    body: dict[str, Any],
    messages: list[Message],
    choice: tuple[str | dict[str, Any], list[Tool]],
    sampling: Sampling,
    **fields: Any,
) -> GenerationRequest:
    """The ``GenerationRequest`` of an API's validated request ``req`` (its ``model`` and
    ``stream``) and body as sent; ``choice`` is (tool_choice, tools); ``fields`` are the
    rest (user, metadata, session hint, ...)."""
    tool_choice, tools = choice
    return GenerationRequest(
        protocol=protocol,
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling,
        stream=req.stream,
        raw=body,
        **fields,
    )


def token_ids(prep: Prepared, c: Completion | None = None) -> dict[str, Any]:
    """``return_token_ids`` (vLLM's opt-in): ``prompt_token_ids`` and, for a finished
    choice ``c``, its ``token_ids``, exactly as the engine saw and sampled them (and as
    they are recorded); empty unless the client asked."""
    if not prep.req.return_token_ids:
        return {}
    out: dict[str, Any] = {"prompt_token_ids": prep.prompt_ids}
    if c is not None:
        out["token_ids"] = c.output_ids
    return out


# ---- the dashboard -----------------------------------------------------------------


def display(messages: list[Message]) -> list[dict[str, Any]]:
    """Internal messages as the dashboard shows them (role, text, tool calls)."""
    return [
        {
            "role": m.role,
            "text": m.content,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
            ],
            "tool_call_id": m.tool_call_id,
            "name": m.name,
        }
        for m in messages
    ]


def display_or_raw(parse: Callable[[], list[Message]], raw: Any) -> list[dict[str, Any]]:
    """``display(parse())``; a stored request the translator no longer accepts is shown as
    its JSON rather than not at all."""
    try:
        return display(parse())
    except Exception:  # noqa: BLE001 - a dashboard page, not a request: never a 500
        text = json.dumps(raw, ensure_ascii=False, default=str)
        return [{"role": "?", "text": text, "tool_calls": [], "tool_call_id": None, "name": None}]


# ---- answers -----------------------------------------------------------------------


def sse_data(obj: Any) -> bytes:
    """An SSE event with data only (OpenAI chat)."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def sse_event(kind: str, obj: Any) -> bytes:
    """A named SSE event (Anthropic Messages, OpenAI Responses)."""
    data = json.dumps(obj, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()
