"""Optional redaction of secrets and personal data before a record is stored.

Off by default. On for every project with the deployment setting ``redact`` (env
``RLGATE_REDACT=true``), or for one project with ``Project.settings["redaction"] =
{"enabled": true}``. Extra patterns come from the setting ``redact_patterns`` and from
``Project.settings["redaction"]["patterns"]``: regular expressions (data, never code),
validated by :func:`core.redaction_patterns.check_pattern` before use.

What a redacted record looks like (see docs/data-protection.md):

- every matching span of every string in ``request`` and ``output`` (and in a new
  session's ``metadata``) becomes ``[REDACTED:<kind>]``;
- ``prompt_token_ids``, ``completion_token_ids`` and ``completion_logprobs`` are emptied:
  the ids decode back to the secret, and ids that no longer match the stored text are
  not token-exact training data;
- ``request["rlgate_redaction"] = {"redacted": true, "counts": {kind: n}, "dropped": [...]}``
  marks it; the trainer never trains on a record marked ``redacted``.

A record in which nothing matched is stored unchanged (token ids kept, trainable).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.db import DB_DOWN, STALE_IF_DOWN_S
from core.redaction_patterns import RedactionConfigError, compile_patterns
from gateway.recording.spool import SpoolRecord
from schemas.tables import ProjectRow

log = logging.getLogger("rlgate.redaction")

MARKER = "rlgate_redaction"
TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")

# Built-in kinds, applied in this order after the custom patterns. Each starts with a
# lookbehind so a match can only begin at the start of a run of its characters: the
# engine scans a long run once instead of once per position (no quadratic time on a
# 100 kB blob without a match).
_B64 = r"[A-Za-z0-9+/_-]"
BUILTIN: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "api_key",
        re.compile(
            r"(?<![A-Za-z0-9_-])(?:sk-[A-Za-z0-9_-]{16,}|rlg_(?:admin|agent|feedback)_"
            r"[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|xox[abpors]-[A-Za-z0-9-]{10,}"
            r"|AKIA[0-9A-Z]{16})"
        ),
    ),
    ("bearer_token", re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{16,}")),
    (
        "email",
        re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"),
    ),
    (
        "phone",
        re.compile(
            r"(?<![\w.+-])(?:\+\d(?:[ .-]?\d){6,14}"
            r"|(?:\(\d{2,4}\) ?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4})(?![\w]|[.-]\d)"
        ),
    ),
    ("hex_secret", re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,}(?![0-9A-Za-z])")),
    (
        "base64_secret",
        re.compile(
            rf"(?<!{_B64})(?={_B64}*\d)(?={_B64}*[a-z])(?={_B64}*[A-Z]){_B64}{{40,}}={{0,2}}"
        ),
    ),
)
KINDS = (*(k for k, _ in BUILTIN), "custom")


# ---- redacting -------------------------------------------------------------------------


@dataclass(frozen=True)
class Redactor:
    """Replaces every match of the custom patterns, then of the built-in kinds."""

    custom: tuple[re.Pattern[str], ...] = ()
    config_error: str | None = None

    def text(self, s: str, counts: Counter[str]) -> str:
        for pattern in self.custom:
            s, n = pattern.subn("[REDACTED:custom]", s)
            counts["custom"] += n
        for kind, pattern in BUILTIN:
            s, n = pattern.subn(f"[REDACTED:{kind}]", s)
            counts[kind] += n
        return s

    def value(self, v: Any, counts: Counter[str]) -> Any:
        """A copy of a JSON value with every string redacted (keys are left alone)."""
        if isinstance(v, str):
            return self.text(v, counts)
        if isinstance(v, dict):
            return {k: self.value(x, counts) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x, counts) for x in v]
        return v

    def record(self, item: SpoolRecord) -> SpoolRecord:
        """One spool record (the interaction and the session it opened), redacted; the
        interaction is marked and its token data dropped when anything matched."""
        counts: Counter[str] = Counter()
        rec = dict(item["interaction"])
        rec["request"] = self.value(rec.get("request") or {}, counts)
        rec["output"] = self.value(rec.get("output") or {}, counts)
        session = item["session"]
        if session is not None and session.get("metadata"):
            session = {**session, "metadata": self.value(session["metadata"], counts)}
        found = {k: n for k, n in counts.items() if n}
        if found or self.config_error:
            for name in TOKEN_FIELDS:
                rec[name] = []
            rec["request"][MARKER] = {
                "redacted": True,
                "counts": found,
                "dropped": list(TOKEN_FIELDS),
                **({"config_error": self.config_error} if self.config_error else {}),
            }
        return SpoolRecord(interaction=rec, session=session)


def strip_client_marker(item: SpoolRecord) -> SpoolRecord:
    """A client cannot send the marker itself (it would skip training or retention)."""
    request = item["interaction"].get("request")
    if isinstance(request, dict) and MARKER in request:
        request = {k: v for k, v in request.items() if k != MARKER}
        interaction = {**item["interaction"], "request": request}
        item = SpoolRecord(interaction=interaction, session=item["session"])
    return item


class RedactionPolicy:
    """Which redactor applies to a project: the deployment setting, or-ed with the
    project's ``settings["redaction"]``, read from the database at most every ``ttl_s``."""

    def __init__(
        self,
        factory: sessionmaker[Session] | None,
        enabled: bool = False,
        patterns: Sequence[str] = (),
        ttl_s: float = 5.0,
    ) -> None:
        self.factory = factory
        self.enabled = enabled
        self.patterns = compile_patterns(patterns)
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Redactor | None]] = {}

    def _build(self, project_settings: dict[str, Any] | None) -> Redactor | None:
        conf = (project_settings or {}).get("redaction") or {}
        if not isinstance(conf, dict):
            conf = {"enabled": True, "patterns": ["<not an object>"]}
        on = self.enabled or conf.get("enabled") is True
        if not on:
            return None
        try:
            extra = compile_patterns(conf.get("patterns") or [])
        except RedactionConfigError as e:
            # fail closed: the record is still redacted (built-in kinds, deployment
            # patterns) and its token data dropped; the error is logged and marked
            log.error("project redaction settings ignored: %s", e)
            return Redactor(self.patterns, config_error=str(e))
        return Redactor(self.patterns + extra)

    def for_project(self, project_id: str) -> Redactor | None:
        """Blocking (a database read on a cache miss)."""
        hit = self._cache.get(project_id)
        now = time.monotonic()
        if hit and now - hit[0] < self.ttl_s:
            return hit[1]
        settings = None
        if self.factory is not None:
            try:
                with self.factory() as db:
                    project = db.get(ProjectRow, project_id)
                    settings = dict(project.settings or {}) if project is not None else None
            except DB_DOWN:
                if hit and now - hit[0] < STALE_IF_DOWN_S:
                    return hit[1]  # the project's setting as last read
                # never read: fail closed (redacted with the built-in kinds, ids dropped)
                return Redactor(self.patterns, config_error="project settings unreadable")
        redactor = self._build(settings)
        self._cache[project_id] = (now, redactor)
        return redactor

    async def redactor(self, project_id: str) -> Redactor | None:
        """``for_project`` without blocking the event loop (the cache, else a thread)."""
        hit = self._cache.get(project_id)
        if hit and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        return await asyncio.to_thread(self.for_project, project_id)

    async def apply(self, project_id: str, items: list[SpoolRecord]) -> list[SpoolRecord]:
        """The recorder items for ``project_id``, redacted when redaction is on for it."""
        items = [strip_client_marker(i) for i in items]
        redactor = await self.redactor(project_id)
        if redactor is None:
            return items
        return await asyncio.to_thread(lambda: [redactor.record(i) for i in items])
