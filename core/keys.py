"""API keys: generation, hashing, lookup and revocation.

A secret is ``rlg_<kind>_<43 url-safe chars>`` (256 random bits). Only its SHA-256 is
stored: with 256 bits of entropy a slow password hash adds nothing, and a plain hash
lets lookup be one indexed equality query on the hash, which takes the same time
whatever the secret is (no prefix scan, no per-character comparison of secrets).

The stored ``prefix`` (shown in key lists) is at most 8 characters and never more than a
quarter of the secret, so a list never reveals a key. Keys minted by another key
(``POST /v1/sessions``, ``/rl/start_session``) record it as ``parent_key_id``: revoking the
parent revokes them, and :func:`lookup_key` also refuses a key whose parent (or its
parent's parent) is revoked. A session-bound key stops authenticating once its session
has been closed for longer than the grace period (late feedback on the ended session
is still accepted within it; model calls on a closed session are refused anyway).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.atdp import KeyKind, SessionStatus
from schemas.coltypes import utcnow
from schemas.tables import ApiKeyRow, AuditEventRow, ProjectRow, SessionRow

PREFIX_MAX = 8  # characters of a secret a key list may show
MIN_CHOSEN_LEN = 32  # minimum length of a caller-chosen key (AReaL's api_key)
MAX_PARENT_DEPTH = 8
# where `rlgate up` keeps the agent and admin keys it prints, in its data directory
# (rlgate/up_keys.py writes it; the dashboard's login page names it)
UP_KEYS_FILE = "up-keys.json"


def up_keys_path(data_dir: Path) -> Path:
    """The file of `rlgate up`'s keys in ``data_dir`` (its ``"admin"`` entry: an admin key)."""
    return Path(data_dir) / UP_KEYS_FILE


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def display_prefix(secret: str) -> str:
    """What a key list shows of a secret: at most 8 characters and at most a quarter."""
    return secret[: min(PREFIX_MAX, len(secret) // 4)]


def generate_secret(kind: KeyKind | str) -> str:
    return f"rlg_{KeyKind(kind).value}_{secrets.token_urlsafe(32)}"


def ensure_project(db: Session, project_id: str) -> ProjectRow:
    project = db.get(ProjectRow, project_id)
    if project is None:
        project = ProjectRow(id=project_id, name=project_id, created_at=utcnow())
        db.add(project)
        db.flush()
    return project


def create_key(
    db: Session,
    project_id: str,
    kind: KeyKind | str,
    *,
    name: str | None = None,
    session_id: str | None = None,
    parent_key_id: str | None = None,
    actor: str = "cli",
) -> tuple[ApiKeyRow, str]:
    """Create a key; returns the row and the secret (shown once, never stored).
    ``parent_key_id``: the key that minted it (revoking that one revokes this one)."""
    ensure_project(db, project_id)
    secret = generate_secret(kind)
    row = ApiKeyRow(
        id=new_id("key"),
        project_id=project_id,
        kind=KeyKind(kind).value,
        key_hash=hash_secret(secret),
        prefix=display_prefix(secret),
        name=name,
        session_id=session_id,
        parent_key_id=parent_key_id,
        created_at=utcnow(),
    )
    db.add(row)
    details = {"kind": row.kind, "name": name, "session_id": session_id}
    audit(db, actor, "key.create", project_id, "api_key", row.id, details)
    return row, secret


def find_key(db: Session, secret: str) -> ApiKeyRow | None:
    """The key row with this secret, whatever its state (revoked, parent, session)."""
    digest = hash_secret(secret)
    row = db.scalars(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest)).one_or_none()
    if row is None or not hmac.compare_digest(row.key_hash, digest):  # defence in depth
        return None
    return row


def _session_ended(db: Session, row: ApiKeyRow, session_grace_s: float) -> bool:
    """Whether a session-bound key's session ended more than ``session_grace_s`` ago."""
    if row.session_id is None:
        return False
    srow = db.get(SessionRow, row.session_id)
    if srow is None or srow.status == SessionStatus.open:
        return False
    closed = srow.closed_at or srow.last_activity_at
    return (utcnow() - closed).total_seconds() > session_grace_s


def key_usable(db: Session, row: ApiKeyRow, session_grace_s: float = 3600.0) -> bool:
    """Whether a key may authenticate: neither it nor any key up its chain of parents is
    revoked, missing, or bound to a session that ended more than ``session_grace_s``
    seconds ago. (A session-bound key mints no keys today; a chain below one comes from
    older data, and ends with the session it hangs from.)"""
    link: ApiKeyRow | None = row
    depth = 0
    while link is not None:
        if link.revoked_at is not None or _session_ended(db, link, session_grace_s):
            return False
        if link.parent_key_id is None:
            return True
        depth += 1
        if depth > MAX_PARENT_DEPTH:
            return False
        link = db.get(ApiKeyRow, link.parent_key_id)
    return False  # a missing parent


def lookup_key(
    db: Session, secret: str, *, touch: bool = False, session_grace_s: float = 3600.0
) -> ApiKeyRow | None:
    """The usable key with this secret, or None (unknown, revoked, revoked parent, or
    session ended longer than ``session_grace_s`` ago)."""
    row = find_key(db, secret)
    if row is None or not key_usable(db, row, session_grace_s):
        return None
    if touch:
        row.last_used_at = utcnow()
    return row


def revoke_key(db: Session, key_id: str, *, actor: str = "cli") -> ApiKeyRow | None:
    """Revoke a key and every key it minted (their children too)."""
    row = db.get(ApiKeyRow, key_id)
    if row is None:
        return None
    now = utcnow()
    todo, seen = [row], set()
    while todo:
        key = todo.pop()
        if key.id in seen:
            continue
        seen.add(key.id)
        if key.revoked_at is None:
            key.revoked_at = now
            details = {} if key is row else {"parent": row.id}
            audit(db, actor, "key.revoke", key.project_id, "api_key", key.id, details)
        todo.extend(db.scalars(select(ApiKeyRow).where(ApiKeyRow.parent_key_id == key.id)))
    return row


def audit(
    db: Session,
    actor: str,
    action: str,
    project_id: str | None,
    target_type: str | None,
    target_id: str | None,
    details: dict,
    at: datetime | None = None,
) -> AuditEventRow:
    event = AuditEventRow(
        id=new_id("evt"),
        project_id=project_id,
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        details=details,
        created_at=at or utcnow(),
    )
    db.add(event)
    return event
