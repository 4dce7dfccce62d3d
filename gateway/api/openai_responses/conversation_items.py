"""Items as the Conversations API and ``GET /v1/responses/{id}/input_items`` show them,
and the list parameters and pages both share.

A client's input items (``message``, ``function_call``, ``function_call_output``,
``reasoning``) are checked as ``responses.create`` checks its input (a 400 naming the
field), then given the API's shape and an id. The input items of response ``resp_x``
have ids derived from it (the same on every read, and the same in a conversation the
response was appended to); items added with ``POST /v1/conversations/{id}/items`` get
fresh ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from gateway.api.openai_responses.protocol import new_id
from gateway.api.openai_responses.translator import parse_input
from gateway.edge.errors import bad_request

PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
MAX_LIMIT = 100


def derived_id(kind: str, response_id: str, index: int) -> str:
    """The id of input item ``index`` of response ``response_id``."""
    digest = hashlib.sha256(f"{response_id}:{index}".encode()).hexdigest()[:24]
    return f"{PREFIX.get(kind, 'item')}_{digest}"


def _kind(item: dict[str, Any]) -> str:
    return str(item.get("type") or ("message" if "role" in item else ""))


def _content(role: str, raw: Any) -> list[Any]:
    if isinstance(raw, str):
        kind = "output_text" if role == "assistant" else "input_text"
        part: dict[str, Any] = {"type": kind, "text": raw}
        if kind == "output_text":
            part["annotations"] = []
        return [part]
    return list(raw or [])


def shaped(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    """One checked input item in the API's shape, with id ``item_id``."""
    kind = _kind(item)
    if kind == "message":
        role = str(item.get("role"))
        return {
            "type": "message",
            "id": item_id,
            "status": "completed",
            "role": role,
            "content": _content(role, item.get("content")),
        }
    if kind == "function_call":
        args = item.get("arguments")
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": args if isinstance(args, str) else json.dumps(args or {}),
            "status": "completed",
        }
    if kind == "function_call_output":
        return {
            "type": "function_call_output",
            "id": item_id,
            "call_id": item["call_id"],
            "output": item.get("output"),
            "status": "completed",
        }
    return {**item, "type": kind, "id": item_id, "summary": item.get("summary") or []}


def api_items(raw: Any, where: str, response_id: str | None = None) -> list[dict[str, Any]]:
    """Input ``raw`` (a string, or a list of items) checked (400 naming ``where``) and in
    the API's shape; ids derived from ``response_id``, or fresh without one."""
    if raw is None:
        return []
    if not isinstance(raw, (str, list)):
        raise bad_request(f"{where} must be a string or a list of items", where)
    if isinstance(raw, list) and any(is_reference(i) for i in raw):  # resolved before
        raise bad_request(f"{where}: an item_reference was not resolved", where)
    parse_input(raw, where)  # the same checks as responses.create's input
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
    out = []
    for i, item in enumerate(items):
        kind = _kind(item)
        item_id = (
            derived_id(kind, response_id, i) if response_id else new_id(PREFIX.get(kind, "item"))
        )
        out.append(shaped(item, item_id))
    return out


def is_reference(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "item_reference"


# what ``include`` may name (OpenAI's ``ResponseIncludable``): data of items rlgate never
# holds (hosted tools' results, images, encrypted reasoning, output text logprobs), so a
# valid ``include`` adds nothing to the items it answers
INCLUDABLE = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)


def check_include(request: Request) -> frozenset[str]:
    """The Conversations item routes' ``include`` query values (``include`` or
    ``include[]``, repeated), each one OpenAI defines; a 400 naming them otherwise."""
    q = request.query_params
    values = frozenset(q.getlist("include") + q.getlist("include[]"))
    unknown = sorted(values - INCLUDABLE)
    if unknown:
        raise bad_request(
            f"include: {', '.join(map(repr, unknown))} is not one of "
            f"{', '.join(sorted(INCLUDABLE))}",
            "include",
        )
    return values


# ---- lists ---------------------------------------------------------------------------


@dataclass
class ListParams:
    limit: int = 20
    order: str = "desc"
    after: str | None = None


def list_params(request: Request) -> ListParams:
    """``limit`` (1-100, default 20), ``order`` (asc|desc, default desc) and ``after`` of
    a list request's query; a 400 naming the parameter otherwise."""
    q = request.query_params
    raw_limit = q.get("limit")
    limit = 20
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            raise bad_request("limit must be an integer between 1 and 100", "limit") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise bad_request("limit must be between 1 and 100", "limit")
    order = q.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise bad_request("order must be 'asc' or 'desc'", "order")
    return ListParams(limit, order, q.get("after") or None)


def page(rows: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": rows,
        "first_id": rows[0]["id"] if rows else None,
        "last_id": rows[-1]["id"] if rows else None,
        "has_more": has_more,
    }


def page_of(items: list[dict[str, Any]], params: ListParams) -> dict[str, Any]:
    """A page of ``items`` (oldest first) by ``params``; an ``after`` not among them
    is a 400."""
    ordered = items if params.order == "asc" else list(reversed(items))
    start = 0
    if params.after is not None:
        ids = [i["id"] for i in ordered]
        if params.after not in ids:
            raise bad_request(f"after: no item with id '{params.after}' in this list", "after")
        start = ids.index(params.after) + 1
    rows = ordered[start : start + params.limit]
    return page(rows, start + params.limit < len(ordered))
