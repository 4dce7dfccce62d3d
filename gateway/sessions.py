"""Sessions: which trajectory a call belongs to, and which earlier call it continues.

Three ways in:
(a) a per-session key (from ``POST /v1/sessions``) is bound to one session;
(b) a fixed key plus an ``X-Session-Id`` header (or a client's own session id, e.g.
    Claude Code's ``metadata.user_id``) names the session; it is created on first use;
(c) a fixed key alone: the gateway stitches. Each recorded answer leaves a continuation
    hash (request messages + the answer). A new call whose messages begin with such a
    conversation joins that interaction's session with it as parent; otherwise a new
    session opens. Sessions idle longer than the timeout are not joined.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth import Principal
from gateway.errors import APIError
from gateway.request import Message
from schemas.coltypes import utcnow
from schemas.tables import InteractionRow, SessionRow


def new_session_id() -> str:
    return "sess_" + secrets.token_hex(12)


def _canon_args(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments


def canonical(m: Message) -> list:
    calls = [[c.name, _canon_args(c.arguments)] for c in m.tool_calls]
    return [m.role, (m.content or "").strip(), calls, m.tool_call_id or ""]


def conversation_hash(messages: list[Message]) -> str:
    data = json.dumps([canonical(m) for m in messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def prefix_hashes(messages: list[Message]) -> list[str]:
    """Hashes of every prefix that ends with an assistant turn, longest first."""
    out = []
    for k in range(len(messages) - 1, 0, -1):
        if messages[k - 1].role == "assistant":
            out.append(conversation_hash(messages[:k]))
    return out


@dataclass
class SessionContext:
    session_id: str
    parent_id: str | None
    created: bool


class SessionStore:
    def __init__(self, factory: sessionmaker[Session], idle_timeout_s: float) -> None:
        self.factory = factory
        self.idle = timedelta(seconds=idle_timeout_s)
        # continuation hash -> (project, key, session, interaction): answers not yet in
        # the database are found here, so a fast follow-up call still stitches
        self.recent: OrderedDict[str, tuple[str, str, str, str]] = OrderedDict()

    def remember(
        self, project: str, key_id: str, session_id: str, interaction_id: str, continuation: str
    ) -> None:
        self.recent[continuation] = (project, key_id, session_id, interaction_id)
        self.recent.move_to_end(continuation)
        while len(self.recent) > 50_000:
            self.recent.popitem(last=False)

    def _find_parent(
        self, db: Session, p: Principal, hashes: list[str], session_id: str | None
    ) -> tuple[str, str] | None:
        """(session id, interaction id) of the longest earlier conversation this extends."""
        if not hashes:
            return None
        for h in hashes:  # longest first
            hit = self.recent.get(h)
            if (
                hit
                and hit[0] == p.project_id
                and (session_id is None or hit[2] == session_id)
                and (session_id is not None or hit[1] == p.key_id)
            ):
                return hit[2], hit[3]
        q = (
            select(InteractionRow.continuation_hash, InteractionRow.session_id, InteractionRow.id)
            .join(SessionRow, SessionRow.id == InteractionRow.session_id)
            .where(
                InteractionRow.project_id == p.project_id,
                InteractionRow.continuation_hash.in_(hashes),
            )
        )
        if session_id is not None:
            q = q.where(InteractionRow.session_id == session_id)
        else:
            q = q.where(SessionRow.api_key_id == p.key_id)
        found = {h: (s, i) for h, s, i in db.execute(q).all()}
        for h in hashes:
            if h in found:
                return found[h]
        return None

    def _create(
        self, db: Session, p: Principal, protocol: str, external_id: str | None, agent: str | None
    ) -> SessionRow:
        now = utcnow()
        row = SessionRow(
            id=new_session_id(),
            project_id=p.project_id,
            api_key_id=p.key_id,
            client_protocol=protocol,
            external_id=external_id,
            agent_name=agent,
            status="open",
            created_at=now,
            last_activity_at=now,
            meta={},
        )
        db.add(row)
        return row

    def resolve(
        self,
        p: Principal,
        messages: list[Message],
        protocol: str,
        external_id: str | None,
        agent: str | None,
    ) -> SessionContext:
        hashes = prefix_hashes(messages)
        with self.factory() as db, db.begin():
            if p.session_id:  # (a) per-session key
                row = db.get(SessionRow, p.session_id)
                if row is None or row.status != "open":
                    raise APIError(
                        403,
                        f"session {p.session_id} is closed; start a new one with POST /v1/sessions",
                    )
                hit = self._find_parent(db, p, hashes, row.id)
                return SessionContext(row.id, hit[1] if hit else None, False)
            if external_id:  # (b) named by the client
                row = db.scalars(
                    select(SessionRow)
                    .where(
                        SessionRow.project_id == p.project_id,
                        SessionRow.external_id == external_id,
                        SessionRow.status == "open",
                    )
                    .order_by(SessionRow.created_at.desc())
                    .limit(1)
                ).first()
                if row is None:
                    row = self._create(db, p, protocol, external_id, agent)
                    return SessionContext(row.id, None, True)
                hit = self._find_parent(db, p, hashes, row.id)
                return SessionContext(row.id, hit[1] if hit else None, False)
            # (c) stitching by conversation prefix
            hit = self._find_parent(db, p, hashes, None)
            if hit:
                row = db.get(SessionRow, hit[0])
                if (
                    row is not None
                    and row.status == "open"
                    and (utcnow() - row.last_activity_at <= self.idle)
                ):
                    return SessionContext(row.id, hit[1], False)
            row = self._create(db, p, protocol, None, agent)
            return SessionContext(row.id, None, True)

    def discard_if_empty(self, session_id: str) -> None:
        with self.factory() as db, db.begin():
            has_any = db.scalars(
                select(InteractionRow.id).where(InteractionRow.session_id == session_id).limit(1)
            ).first()
            row = db.get(SessionRow, session_id)
            if row is not None and has_any is None:
                db.delete(row)

    def expire_idle(self) -> int:
        """Mark open sessions idle past the timeout as expired."""
        cutoff = utcnow() - self.idle
        with self.factory() as db, db.begin():
            rows = db.scalars(
                select(SessionRow)
                .where(SessionRow.status == "open", SessionRow.last_activity_at < cutoff)
                .limit(1000)
            ).all()
            now = utcnow()
            for row in rows:
                row.status = "expired"
                row.closed_at = now
            return len(rows)
