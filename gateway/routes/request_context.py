"""Helpers every route module uses: the gateway state, the caller, the JSON body."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from fastapi import Request

from gateway.edge.auth import Principal, presented_secret
from gateway.edge.errors import bad_request
from gateway.edge.storable import check_body, too_deep

if TYPE_CHECKING:
    from gateway.call.generation import Prepared
    from gateway.state import Gateway


def gw_of(request: Request) -> Gateway:
    """The running gateway (settings, db session factory, pipeline, recorder, ...)."""
    return request.app.state.gw


async def principal(request: Request) -> Principal:
    """The caller, from `Authorization: Bearer <key>` or `x-api-key`; 401 otherwise."""
    auth = gw_of(request).auth
    secret = presented_secret(request)
    return auth.cached(secret) or await asyncio.to_thread(auth.resolve, secret)


# Bodies larger than this are parsed and checked on a worker thread, off the event loop.
PARSE_OFF_LOOP_BYTES = 256 * 1024


def parse_json(raw: bytes) -> Any:
    """The parsed body, checked to be storable (gateway.edge.storable); 400 otherwise (not
    JSON, or nested too deeply: json's RecursionError is a 400 too, never a 500)."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    except RecursionError:
        raise too_deep() from None
    return check_body(body)


async def read_json(request: Request) -> Any:
    """The JSON body (``parse_json``). Its size is bounded by the body limit
    (gateway.edge.body_limit answers a 413 first); a large body is parsed off the event loop."""
    raw = await request.body()
    if len(raw) > PARSE_OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_json, raw)
    return parse_json(raw)


def headers_for(prep: Prepared) -> dict[str, str]:
    return {
        "X-Rlgate-Session-Id": prep.session.session_id,
        "X-Rlgate-Interaction-Id": prep.interaction_id,
        "X-Rlgate-Policy-Version": prep.policy_version,
    }
