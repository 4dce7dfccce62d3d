"""API keys: generation, hashing, lookup and revocation.

A secret is ``rlg_<kind>_<43 url-safe chars>`` (256 random bits). Only its SHA-256 is
stored: with 256 bits of entropy a slow password hash adds nothing, and a plain hash
lets lookup be one indexed equality query on the hash, which takes the same time
whatever the secret is (no prefix scan, no per-character comparison of secrets).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.atdp import KeyKind
from schemas.coltypes import utcnow
from schemas.tables import ApiKeyRow, AuditEventRow, ProjectRow

PREFIX_LEN = 12


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


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
    actor: str = "cli",
) -> tuple[ApiKeyRow, str]:
    """Create a key; returns the row and the secret (shown once, never stored)."""
    ensure_project(db, project_id)
    secret = generate_secret(kind)
    row = ApiKeyRow(
        id=new_id("key"),
        project_id=project_id,
        kind=KeyKind(kind).value,
        key_hash=hash_secret(secret),
        prefix=secret[:PREFIX_LEN],
        name=name,
        session_id=session_id,
        created_at=utcnow(),
    )
    db.add(row)
    details = {"kind": row.kind, "name": name, "session_id": session_id}
    audit(db, actor, "key.create", project_id, "api_key", row.id, details)
    return row, secret


def lookup_key(db: Session, secret: str, *, touch: bool = False) -> ApiKeyRow | None:
    """The active key with this secret, or None (unknown or revoked)."""
    digest = hash_secret(secret)
    row = db.scalars(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest)).one_or_none()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.key_hash, digest):  # defence in depth
        return None
    if touch:
        row.last_used_at = utcnow()
    return row


def revoke_key(db: Session, key_id: str, *, actor: str = "cli") -> ApiKeyRow | None:
    row = db.get(ApiKeyRow, key_id)
    if row is None:
        return None
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        audit(db, actor, "key.revoke", row.project_id, "api_key", row.id, {})
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
