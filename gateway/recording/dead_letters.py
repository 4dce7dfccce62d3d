"""Records the database refused for their content, kept aside so recording goes on.

``refused_for_content`` tells such a refusal (a value too long for its column, a
character PostgreSQL cannot store, a constraint, a record that does not validate) from
the database being unreachable, which the recorder retries instead. ``DeadLetters``
appends each refused record, with the reason and the time, to a JSON-lines file under
the data dir (``dead_letters.jsonl``), fdatasync'ed before the record leaves the spool,
so nothing acknowledged is lost: an operator can fix and re-import the lines.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

log = logging.getLogger("rlgate.recorder")

# Raised by the record itself, not by the connection: retrying cannot help.
_CONTENT_ERRORS = (
    DataError,  # too long for its column, NUL, bad JSON text, numeric out of range
    IntegrityError,  # a constraint (a race with another replica is retried first)
    ValidationError,  # not an ATDP record
    KeyError,
    TypeError,
    ValueError,
    UnicodeError,
    RecursionError,
)


def refused_for_content(e: BaseException) -> bool:
    """True when the database (or the record's own validation) refused what a record
    holds; False for connection and server trouble, which is worth retrying."""
    if isinstance(e, _CONTENT_ERRORS):
        return True
    # a statement error raised before reaching the database (a bind value's type)
    return isinstance(e, StatementError) and not isinstance(e, DBAPIError)


def describe(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:1000]


class DeadLetters:
    """The dead-letter file: one JSON object per refused record
    (``{"at", "reason", "record"}``); ``count`` is its number of lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.count = self._existing()

    def _existing(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                return sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return 0

    def add(self, record: dict[str, Any], reason: str) -> None:
        """Append and fdatasync one record; raises OSError if the disk refuses."""
        line = {"at": datetime.now(UTC).isoformat(), "reason": reason, "record": record}
        data = json.dumps(line, separators=(",", ":")).encode() + b"\n"
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as fh:
                fh.write(data)
                fh.flush()
                os.fdatasync(fh.fileno())
            self.count += 1
        interaction = record.get("interaction") if isinstance(record, dict) else None
        rid = interaction.get("id") if isinstance(interaction, dict) else None
        log.error("record %s refused by the database (%s); kept in %s", rid, reason, self.path)
