"""Who is calling: API key -> project, key kind, optional session binding."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN, STALE_IF_DOWN_S
from core.errors import APIError
from core.keys import lookup_key
from gateway.edge.credentials import request_credential
from gateway.edge.errors import db_down_error

BOOTSTRAP_ADMIN_ID = "bootstrap-admin"
CACHE_TTL_S = 2.0  # a revoked key stops working within this long on every replica
# (while the database is unreachable, a key verified in the last STALE_IF_DOWN_S still works)


@dataclass(frozen=True)
class Principal:
    key_id: str
    project_id: str
    kind: str  # admin | agent | feedback
    session_id: str | None = None


def presented_secret(request: Request) -> str | None:
    """The request's one key (gateway.edge.credentials: the rate limiter reads the same)."""
    return request_credential(request.scope)


class Authenticator:
    def __init__(
        self,
        factory: sessionmaker[Session],
        admin_key: str | None,
        default_project: str = "default",
        session_grace_s: float = 3600.0,
    ) -> None:
        self.factory = factory
        self.session_grace_s = session_grace_s
        self.admin_key = admin_key
        self.default_project = default_project
        self._cache: dict[str, tuple[float, Principal]] = {}

    def cached(self, secret: str | None) -> Principal | None:
        """The principal if it needs no database lookup (bootstrap key or a fresh cache
        hit); None otherwise. Lets the hot path skip a thread hop."""
        if not secret:
            return None
        if self.admin_key and hmac.compare_digest(secret.encode(), self.admin_key.encode()):
            return Principal(BOOTSTRAP_ADMIN_ID, self.default_project, "admin")
        hit = self._cache.get(secret)
        if hit and time.monotonic() - hit[0] < CACHE_TTL_S:
            return hit[1]
        return None

    def resolve(self, secret: str | None) -> Principal:
        """The caller of this secret; 401 for a missing, unknown or unusable key (revoked,
        a revoked parent, or its session ended past the grace: core.keys.key_usable)."""
        if not secret:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'")
        if self.admin_key and hmac.compare_digest(secret.encode(), self.admin_key.encode()):
            return Principal(BOOTSTRAP_ADMIN_ID, self.default_project, "admin")
        now = time.monotonic()
        hit = self._cache.get(secret)
        if hit and now - hit[0] < CACHE_TTL_S:
            return hit[1]
        try:
            with self.factory() as db:
                row = lookup_key(db, secret, session_grace_s=self.session_grace_s)
                principal = (
                    Principal(row.id, row.project_id, row.kind, row.session_id) if row else None
                )
        except DB_DOWN:  # a key verified recently keeps working while the database is down
            if hit and now - hit[0] < STALE_IF_DOWN_S:
                return hit[1]
            raise db_down_error() from None
        if principal is None:
            self._cache.pop(secret, None)
            raise APIError(401, "invalid or revoked API key")
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[secret] = (now, principal)
        return principal

    def forget(self) -> None:
        self._cache.clear()


def require_kind(principal: Principal, *kinds: str, message: str | None = None) -> None:
    """403 unless the caller's key is of one of ``kinds`` (``message`` says why)."""
    if principal.kind not in kinds:
        raise APIError(
            403,
            message
            or f"this endpoint needs a key of kind {' or '.join(kinds)}, not {principal.kind}",
        )


def require_model_key(principal: Principal) -> None:
    """Model calls need an agent or admin key; a feedback key rates, it does not call."""
    require_kind(
        principal,
        "agent",
        "admin",
        message=f"a {principal.kind} key cannot call models; use an agent key",
    )
