"""Conversations in the database (``conversations``, ``conversation_items``).

Every write commits before the route answers, so a conversation id or item id is
readable on every gateway of the same database the moment the client has it. The
functions here are synchronous (the routes run them in a thread). Deleting sets a marker
(``deleted_at``): the item or conversation is gone from the API, and the interaction
records of the conversation's turns are never touched.
"""

from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.errors import APIError
from gateway.api.openai_responses.conversation_items import ListParams, page
from gateway.edge.auth import Principal
from gateway.edge.errors import bad_request
from gateway.recording.redaction import RedactionPolicy
from schemas.coltypes import utcnow
from schemas.tables import ConversationItemRow, ConversationRow

MAX_KEYS = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512
MAX_INITIAL_ITEMS = 20
MAX_ADDED_ITEMS = 20


def new_conversation_id() -> str:
    return "conv_" + secrets.token_hex(24)


def check_metadata(raw: Any, where: str = "metadata") -> dict[str, str]:
    """At most 16 string keys of up to 64 characters, string values of up to 512."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object of string keys and values", where)
    if len(raw) > MAX_KEYS:
        raise bad_request(f"{where} has {len(raw)} keys; at most {MAX_KEYS} are allowed", where)
    for k, v in raw.items():
        if len(k) > MAX_KEY_CHARS:
            raise bad_request(
                f"{where} key '{k[:70]}...' is longer than {MAX_KEY_CHARS} characters", where
            )
        if not isinstance(v, str):
            raise bad_request(f"{where}.{k} must be a string", f"{where}.{k}")
        if len(v) > MAX_VALUE_CHARS:
            raise bad_request(
                f"{where}.{k} is longer than {MAX_VALUE_CHARS} characters", f"{where}.{k}"
            )
    return dict(raw)


def conversation_json(row: ConversationRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "conversation",
        "created_at": int(row.created_at.timestamp()),
        "metadata": row.meta or {},
    }


def not_found(conversation_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"no conversation with id '{conversation_id}' was found", param=param)


def item_not_found(item_id: str) -> APIError:
    return APIError(404, f"no item with id '{item_id}' was found in this conversation")


def _visible(row: ConversationRow | None, p: Principal) -> bool:
    """A conversation of the caller's project, not deleted; a per-session key sees only
    the conversations created with its session."""
    return (
        row is not None
        and row.deleted_at is None
        and row.project_id == p.project_id
        and (p.session_id is None or row.key_session_id == p.session_id)
    )


class ConversationStore:
    def __init__(
        self, factory: sessionmaker[Session], redaction: RedactionPolicy | None = None
    ) -> None:
        self.factory = factory
        self.redaction = redaction

    def _redacted(self, project_id: str, value: Any) -> Any:
        """``value`` with every string redacted when redaction is on for the project."""
        redactor = self.redaction.for_project(project_id) if self.redaction else None
        return value if redactor is None else redactor.value(value, Counter())

    def _stored_items(self, project_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**self._redacted(project_id, i), "id": i["id"]} for i in items]

    def _get(self, db: Session, cid: str, p: Principal, param: str | None) -> ConversationRow:
        row = db.get(ConversationRow, cid)
        if row is None or not _visible(row, p):
            raise not_found(cid, param)
        return row

    def _add(
        self, db: Session, cid: str, items: list[dict[str, Any]], response_id: str | None
    ) -> None:
        now = utcnow()
        for item in items:
            db.add(
                ConversationItemRow(
                    id=item["id"],
                    conversation_id=cid,
                    response_id=response_id,
                    item=item,
                    created_at=now,
                )
            )

    def create(
        self, p: Principal, metadata: dict[str, str], items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        row = ConversationRow(
            id=new_conversation_id(),
            project_id=p.project_id,
            api_key_id=p.key_id,
            key_session_id=p.session_id,
            meta=self._redacted(p.project_id, metadata),
            created_at=utcnow(),
        )
        items = self._stored_items(p.project_id, items)
        with self.factory() as db, db.begin():
            db.add(row)
            db.flush()
            self._add(db, row.id, items, None)
            out = conversation_json(row)
        return out

    def get(self, cid: str, p: Principal, param: str | None = None) -> dict[str, Any]:
        with self.factory() as db:
            return conversation_json(self._get(db, cid, p, param))

    def update(self, cid: str, p: Principal, metadata: dict[str, str]) -> dict[str, Any]:
        metadata = self._redacted(p.project_id, metadata)
        with self.factory() as db, db.begin():
            row = self._get(db, cid, p, None)
            row.meta = metadata
            return conversation_json(row)

    def delete(self, cid: str, p: Principal) -> dict[str, Any]:
        with self.factory() as db, db.begin():
            self._get(db, cid, p, None).deleted_at = utcnow()
        return {"id": cid, "object": "conversation.deleted", "deleted": True}

    def add_items(
        self,
        cid: str,
        p: Principal,
        items: list[dict[str, Any]],
        response_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Appends ``items``; returns them as stored."""
        items = self._stored_items(p.project_id, items)
        with self.factory() as db, db.begin():
            self._get(db, cid, p, None)
            self._add(db, cid, items, response_id)
        return items

    def items(self, cid: str, p: Principal, params: ListParams) -> dict[str, Any]:
        with self.factory() as db:
            self._get(db, cid, p, None)
            q = select(ConversationItemRow).where(
                ConversationItemRow.conversation_id == cid,
                ConversationItemRow.deleted_at.is_(None),
            )
            if params.after is not None:
                after = db.scalars(
                    select(ConversationItemRow.seq).where(
                        ConversationItemRow.conversation_id == cid,
                        ConversationItemRow.id == params.after,
                    )
                ).first()
                if after is None:
                    raise bad_request(
                        f"after: no item with id '{params.after}' in this conversation", "after"
                    )
                seq = ConversationItemRow.seq
                q = q.where(seq > after if params.order == "asc" else seq < after)
            seq = ConversationItemRow.seq
            q = q.order_by(seq.asc() if params.order == "asc" else seq.desc())
            rows = db.scalars(q.limit(params.limit + 1)).all()
            data = [r.item for r in rows[: params.limit]]
            return page(data, len(rows) > params.limit)

    def history(self, cid: str, p: Principal, before: str | None = None) -> list[dict[str, Any]]:
        """Every item of the conversation, oldest first (404 naming ``conversation``); with
        ``before``, a response id, only the items that came before that response's own
        (none when its items were never appended)."""
        with self.factory() as db:
            self._get(db, cid, p, "conversation")
            q = select(ConversationItemRow.item).where(
                ConversationItemRow.conversation_id == cid,
                ConversationItemRow.deleted_at.is_(None),
            )
            if before is not None:
                first = db.scalar(
                    select(func.min(ConversationItemRow.seq)).where(
                        ConversationItemRow.conversation_id == cid,
                        ConversationItemRow.response_id == before,
                    )
                )
                if first is None:
                    return []
                q = q.where(ConversationItemRow.seq < first)
            return list(db.scalars(q.order_by(ConversationItemRow.seq)).all())

    def items_by_id(self, ids: list[str], p: Principal) -> dict[str, dict[str, Any]]:
        """The items with these ids, of any conversation the caller sees (not deleted):
        what an ``item_reference`` input item names."""
        with self.factory() as db:
            rows = db.execute(
                select(ConversationItemRow.id, ConversationItemRow.item, ConversationRow)
                .join(ConversationRow, ConversationRow.id == ConversationItemRow.conversation_id)
                .where(ConversationItemRow.id.in_(ids), ConversationItemRow.deleted_at.is_(None))
            ).all()
            return {iid: item for iid, item, conv in rows if _visible(conv, p)}

    def _item(self, db: Session, cid: str, item_id: str) -> ConversationItemRow:
        row = db.scalars(
            select(ConversationItemRow).where(
                ConversationItemRow.conversation_id == cid,
                ConversationItemRow.id == item_id,
                ConversationItemRow.deleted_at.is_(None),
            )
        ).first()
        if row is None:
            raise item_not_found(item_id)
        return row

    def item(self, cid: str, item_id: str, p: Principal) -> dict[str, Any]:
        with self.factory() as db:
            self._get(db, cid, p, None)
            return self._item(db, cid, item_id).item

    def delete_item(self, cid: str, item_id: str, p: Principal) -> dict[str, Any]:
        with self.factory() as db, db.begin():
            conv = self._get(db, cid, p, None)
            self._item(db, cid, item_id).deleted_at = utcnow()
            return conversation_json(conv)
