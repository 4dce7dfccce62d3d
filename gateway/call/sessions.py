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
import logging
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN
from core.errors import APIError
from gateway.call.request import Message
from gateway.edge.auth import Principal
from gateway.edge.storable import check_session_fields
from schemas.atdp import Session as AtdpSession
from schemas.atdp import SessionStatus
from schemas.coltypes import utcnow
from schemas.tables import InteractionRow, SessionRow

log = logging.getLogger("rlgate.sessions")


def session_closed(factory: sessionmaker[Session], session_id: str) -> None:
    """The hook for every path that closes a session (end, idle expiry, rating)."""
    try:
        from trainer import api

        api.on_session_closed(factory, session_id)
    except Exception:
        log.exception("session-closed hook failed for %s", session_id)


def new_session_id() -> str:
    return "sess_" + secrets.token_hex(12)


def open_session(
    project_id: str,
    *,
    api_key_id: str | None = None,
    client_protocol: str | None = None,
    external_id: str | None = None,
    agent_name: str | None = None,
    task_id: str | None = None,
    metadata: dict | None = None,
) -> AtdpSession:
    """A new open session, as its ATDP record: every way a session begins starts here (a
    call's first turn, ``POST /v1/sessions``, AReaL's ``/rl/start_session``). The caller
    stores it: with the call's records (SessionStore), or as a row (schemas.convert.to_row)."""
    now = utcnow()
    return AtdpSession(
        id=new_session_id(),
        project_id=project_id,
        api_key_id=api_key_id,
        client_protocol=client_protocol,
        external_id=external_id,
        agent_name=agent_name,
        task_id=task_id,
        status=SessionStatus.open,
        created_at=now,
        last_activity_at=now,
        metadata=metadata or {},
    )


def _canon_args(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError, RecursionError):
        return arguments  # not JSON (or nested past the parser's limit): the text itself


def canonical(m: Message) -> list:
    calls = [[c.name, _canon_args(c.arguments)] for c in m.tool_calls]
    return [m.role, (m.content or "").strip(), calls, m.tool_call_id or ""]


def conversation_hash(messages: list[Message]) -> str:
    data = json.dumps([canonical(m) for m in messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def prefix_hashes(messages: list[Message]) -> list[str]:
    """Hashes of every prefix that ends with an assistant turn, longest first.

    Equal to ``conversation_hash(messages[:k])`` for each such k, in O(total size): the
    JSON of a list is ``[`` + its items' JSON joined by ``,`` + ``]``, so one running
    sha256 takes each message once and a copy of it is closed with ``]`` per prefix."""
    running = hashlib.sha256(b"[")
    found = []
    for k in range(1, len(messages)):  # prefixes messages[:k], k < len(messages)
        item = json.dumps(canonical(messages[k - 1]), sort_keys=True, separators=(",", ":"))
        running.update((item if k == 1 else "," + item).encode())
        if messages[k - 1].role == "assistant":
            h = running.copy()
            h.update(b"]")
            found.append(h.hexdigest())
    found.reverse()
    return found


@dataclass
class SessionContext:
    session_id: str
    parent_id: str | None
    created: bool
    # the ATDP Session record while it is not in the database yet: it travels with the
    # interaction records, so a new session is written together with its first call
    new_row: dict | None = None


class SessionStore:
    def __init__(self, factory: sessionmaker[Session], idle_timeout_s: float) -> None:
        self.factory = factory
        self.idle = timedelta(seconds=idle_timeout_s)
        # continuation hash -> (project, key, session, interaction): answers not yet in
        # the database are found here, so a fast follow-up call still stitches
        self.recent: OrderedDict[str, tuple[str, str, str, str]] = OrderedDict()
        # sessions opened by a call whose records are not committed yet
        self.pending: OrderedDict[str, dict] = OrderedDict()
        self.pending_external: dict[tuple[str, str], str] = {}
        # (project, external id) -> session id of sessions already in the database, so a
        # named session continues while the database is unreachable
        self.known_external: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.lock = threading.Lock()

    def committed(self, session_ids: set[str]) -> None:
        """The recorder wrote these sessions: forget their pending copies."""
        with self.lock:
            for sid in session_ids:
                row = self.pending.pop(sid, None)
                if row and row.get("external_id"):
                    key = (row["project_id"], row["external_id"])
                    self.pending_external.pop(key, None)
                    self._know(key, sid)

    def _know(self, key: tuple[str, str], session_id: str) -> None:
        """Remember a committed named session (caller holds the lock)."""
        self.known_external[key] = session_id
        self.known_external.move_to_end(key)
        while len(self.known_external) > 50_000:
            self.known_external.popitem(last=False)

    def remember(
        self, project: str, key_id: str, session_id: str, interaction_id: str, continuation: str
    ) -> None:
        self.recent[continuation] = (project, key_id, session_id, interaction_id)
        self.recent.move_to_end(continuation)
        while len(self.recent) > 50_000:
            self.recent.popitem(last=False)

    def _find_parent(
        self, db: Session | None, p: Principal, hashes: list[str], session_id: str | None
    ) -> tuple[str, str] | None:
        """(session id, interaction id) of the longest earlier conversation this extends;
        with ``db`` None (the database is down), only what this gateway remembers."""
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
        if db is None:
            return None
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
        self, p: Principal, protocol: str, external_id: str | None, agent: str | None
    ) -> SessionContext:
        row = open_session(
            p.project_id,
            api_key_id=p.key_id,
            client_protocol=protocol,
            external_id=external_id,
            agent_name=agent,
        ).model_dump(mode="json")
        with self.lock:
            self.pending[row["id"]] = row
            if external_id:
                self.pending_external[(p.project_id, external_id)] = row["id"]
            while len(self.pending) > 50_000:
                _, old = self.pending.popitem(last=False)
                if old.get("external_id"):
                    self.pending_external.pop((old["project_id"], old["external_id"]), None)
        return SessionContext(row["id"], None, True, row)

    def _pending(self, session_id: str) -> dict | None:
        with self.lock:
            return self.pending.get(session_id)

    def needs_db(self, p: Principal, messages: list[Message], external_id: str | None) -> bool:
        """False for a fixed key's first turn (no assistant message yet): then resolve()
        opens a new session without reading the database."""
        return bool(p.session_id or external_id or any(m.role == "assistant" for m in messages))

    def resolve(
        self,
        p: Principal,
        messages: list[Message],
        protocol: str,
        external_id: str | None,
        agent: str | None,
    ) -> SessionContext:
        """Which session this call belongs to. Writes nothing: a new session is recorded
        with the call's interaction, so a call that fails leaves nothing behind. A 400 for
        a session id or agent name the sessions table cannot store."""
        check_session_fields(external_id, agent)
        hashes = prefix_hashes(messages)
        try:
            return self._resolve(p, hashes, protocol, external_id, agent)
        except DB_DOWN:
            log.warning("database unreachable: session of key %s resolved from memory", p.key_id)
            return self._resolve_offline(p, hashes, protocol, external_id, agent)

    def _resolve_offline(
        self,
        p: Principal,
        hashes: list[str],
        protocol: str,
        external_id: str | None,
        agent: str | None,
    ) -> SessionContext:
        """resolve() while the database is unreachable, from what this gateway remembers:
        pending and recently committed named sessions, recent continuations. A named
        session it has never seen is opened anew (a second session for that name once the
        database is back, rather than a refused call)."""
        if p.session_id:
            hit = self._find_parent(None, p, hashes, p.session_id)
            sid = p.session_id
        elif external_id:
            with self.lock:
                key = (p.project_id, external_id)
                sid = self.pending_external.get(key) or self.known_external.get(key)
            if sid is None:
                return self._create(p, protocol, external_id, agent)
            hit = self._find_parent(None, p, hashes, sid)
        else:
            hit = self._find_parent(None, p, hashes, None)
            if hit is None:
                return self._create(p, protocol, None, agent)
            sid = hit[0]
        return SessionContext(sid, hit[1] if hit else None, False, self._pending(sid))

    def _resolve(
        self,
        p: Principal,
        hashes: list[str],
        protocol: str,
        external_id: str | None,
        agent: str | None,
    ) -> SessionContext:
        with self.factory() as db:
            if p.session_id:  # (a) per-session key
                row = db.get(SessionRow, p.session_id)
                if row is None or row.status != SessionStatus.open:
                    raise APIError(
                        403,
                        f"session {p.session_id} is closed; start a new one with POST /v1/sessions",
                    )
                hit = self._find_parent(db, p, hashes, row.id)
                return SessionContext(row.id, hit[1] if hit else None, False)
            if external_id:  # (b) named by the client
                # the in-memory pending copy first: the recorder drops it only after its
                # commit, so pending-then-database cannot miss a session that exists
                with self.lock:
                    sid = self.pending_external.get((p.project_id, external_id))
                pending = self._pending(sid) if sid else None
                if sid and pending is not None:
                    hit = self._find_parent(db, p, hashes, sid)
                    return SessionContext(sid, hit[1] if hit else None, False, pending)
                row = db.scalars(
                    select(SessionRow)
                    .where(
                        SessionRow.project_id == p.project_id,
                        SessionRow.external_id == external_id,
                        SessionRow.status == SessionStatus.open,
                    )
                    .order_by(SessionRow.created_at.desc())
                    .limit(1)
                ).first()
                if row is not None:
                    with self.lock:
                        self._know((p.project_id, external_id), row.id)
                    hit = self._find_parent(db, p, hashes, row.id)
                    return SessionContext(row.id, hit[1] if hit else None, False)
                return self._create(p, protocol, external_id, agent)
            # (c) stitching by conversation prefix
            hit = self._find_parent(db, p, hashes, None)
            if hit:
                pending = self._pending(hit[0])
                if pending is not None:
                    return SessionContext(hit[0], hit[1], False, pending)
                row = db.get(SessionRow, hit[0])
                if (
                    row is not None
                    and row.status == SessionStatus.open
                    and (utcnow() - row.last_activity_at <= self.idle)
                ):
                    return SessionContext(row.id, hit[1], False)
            return self._create(p, protocol, None, agent)

    def expire_idle(self) -> int:
        """Mark open sessions idle past the timeout as expired, then settle their credit
        assignment and run their verifiers (:func:`session_closed`)."""
        cutoff = utcnow() - self.idle
        with self.factory() as db, db.begin():
            rows = db.scalars(
                select(SessionRow)
                .where(
                    SessionRow.status == SessionStatus.open, SessionRow.last_activity_at < cutoff
                )
                .limit(1000)
            ).all()
            now = utcnow()
            for row in rows:
                row.status = SessionStatus.expired
                row.closed_at = now
            ids = [row.id for row in rows]
        for sid in ids:
            session_closed(self.factory, sid)  # never raises
        return len(ids)
