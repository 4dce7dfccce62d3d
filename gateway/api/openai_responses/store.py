"""Stored responses for ``previous_response_id`` and ``GET /v1/responses/{id}``.

Responses are stored as what every call already is: a recorded interaction (request JSON
as sent + parsed output). ``previous_response_id`` rebuilds the conversation by walking
those records back; a response this process answered is found in memory at once, one
answered by another replica is looked up again briefly (gateway.routes.waits.locate: on the event
loop, never holding a worker thread). A response of another project, of another session
(for a per-session key), or one created with ``store: false``, is a 404. So is a deleted
one (``DELETE /v1/responses/{id}``: a ``response_deletions`` marker, the record untouched);
another replica may still continue one it holds in memory until that memory turns over.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from fastapi import Request
from sqlalchemy import select

from core.db import transaction
from core.errors import APIError
from gateway.api.openai_responses import conversations
from gateway.api.openai_responses.translator import history_turn
from gateway.call.request import Message
from gateway.edge.auth import Principal
from gateway.routes.request_context import gw_of
from gateway.routes.waits import locate
from schemas.tables import InteractionRow, ResponseDeletionRow

MAX_CHAIN = 10_000

# project, session, request JSON, output
Stored = tuple[str, str, dict[str, Any], dict[str, Any]]


def visible(p: Principal, project: str, session: str) -> bool:
    """Whether a caller may read or continue a response: its project and, for a
    per-session key, its session."""
    return project == p.project_id and (p.session_id is None or session == p.session_id)


def gone(rid: str, param: str | None = None) -> APIError:
    """The 404 of a response that is not there (never was, another's, or deleted)."""
    return APIError(404, f"no response with id '{rid}' was found", param=param)


class ResponseStore:
    """Recent responses of this process (id -> project, session, request, output) plus
    the database."""

    def __init__(self, factory: Any, capacity: int = 20_000, max_bytes: int = 64 << 20) -> None:
        self.factory = factory
        self.capacity = capacity
        self.max_bytes = max_bytes  # JSON size of the kept requests + outputs
        self.bytes = 0
        self.recent: OrderedDict[str, Stored] = OrderedDict()
        self._sizes: dict[str, int] = {}

    def remember(
        self, rid: str, project: str, session: str, request: dict[str, Any], output: dict[str, Any]
    ) -> None:
        """Keep a response; the oldest go once over ``capacity`` entries or ``max_bytes``
        (older ones are then read from the database)."""
        size = len(json.dumps(request, default=str)) + len(json.dumps(output, default=str))
        self.bytes += size - self._sizes.get(rid, 0)
        self._sizes[rid] = size
        self.recent[rid] = (project, session, request, output)
        self.recent.move_to_end(rid)
        while self.recent and (len(self.recent) > self.capacity or self.bytes > self.max_bytes):
            old, _ = self.recent.popitem(last=False)
            self.bytes -= self._sizes.pop(old, 0)

    def forget(self, rid: str) -> None:
        """Drop a response from this process's memory (it was deleted)."""
        if self.recent.pop(rid, None) is not None:
            self.bytes -= self._sizes.pop(rid, 0)

    def delete(self, rid: str, project: str, key_id: str | None) -> None:
        """Hide response ``rid`` from the API: a marker row (its record is never
        touched); synchronous (the route runs it in a thread)."""
        with transaction(self.factory) as db:
            if db.get(ResponseDeletionRow, rid) is None:
                db.add(ResponseDeletionRow(response_id=rid, project_id=project, api_key_id=key_id))
        self.forget(rid)

    def _db_get(self, rid: str) -> Stored | None:
        with self.factory() as db:
            if db.get(ResponseDeletionRow, rid) is not None:
                raise gone(rid, "previous_response_id")
            row = db.execute(
                select(
                    InteractionRow.project_id,
                    InteractionRow.session_id,
                    InteractionRow.request,
                    InteractionRow.output,
                ).where(InteractionRow.id == rid)
            ).first()
        return (row[0], row[1], row[2], row[3]) if row else None

    async def get(
        self, rid: str, p: Principal, http: Request
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        hit = self.recent.get(rid)
        if hit is None and rid.startswith("resp_"):
            hit = await locate(http, p.key_id, rid, lambda: self._db_get(rid))
        if hit is None or not visible(p, hit[0], hit[1]):
            raise gone(rid, "previous_response_id")
        _, _, request, output = hit
        if request.get("store") is False:
            raise APIError(
                404,
                f"response '{rid}' was created with store: false, so it cannot be continued; "
                "send the whole conversation as input instead",
                param="previous_response_id",
            )
        return request, output

    async def conversation(self, rid: str, p: Principal, http: Request) -> list[Message]:
        """All messages up to and including the answer of response ``rid``: its chain of
        ``previous_response_id``s and, for a response made in a ``conversation``, that
        conversation's items before it (none if the conversation is gone)."""
        turns: list[list[Message]] = []
        seen: set[str] = set()
        current: str | None = rid
        while current and current not in seen and len(turns) < MAX_CHAIN:
            seen.add(current)
            request, output = await self.get(current, p, http)
            turns.append(history_turn(request, output))
            if request.get("conversation") is not None:
                turns.append(await _conversation_before(http, p, request, current))
                break  # conversation and previous_response_id never come together
            prev = request.get("previous_response_id")
            current = prev if isinstance(prev, str) else None
        return [m for turn in reversed(turns) for m in turn]


async def _conversation_before(
    http: Request, p: Principal, request: dict[str, Any], rid: str
) -> list[Message]:
    """The items of the conversation ``request`` named that came before response ``rid``."""
    try:
        cid = conversations.conversation_id(request["conversation"])
        return await conversations.history(http, p, cid, before=rid)
    except APIError as e:
        if e.status == 404:  # deleted since: the response's own turn is what is left
            return []
        raise


def store_of(request: Request) -> ResponseStore:
    state = request.app.state
    store = getattr(state, "responses_store", None)
    if store is None:
        store = ResponseStore(gw_of(request).factory)
        state.responses_store = store
    return store
