"""The agent and admin keys `rlgate up` prints, kept across restarts.

They live in ``<data dir>/up-keys.json`` (mode 0600: it holds the secrets). A start reuses
each one that is still usable in the database it runs on (not revoked, same project), and
mints a new one in place of one that is not; ``--new-keys`` revokes the kept ones and
mints both anew.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from core.keys import UP_KEYS_FILE, create_key, find_key, key_usable, revoke_key, up_keys_path

KEYS_FILE = UP_KEYS_FILE
KINDS = ("agent", "admin")


@dataclass(frozen=True)
class UpKeys:
    agent: str
    admin: str
    reused: bool  # both came from the file


def keys_path(data_dir: Path) -> Path:
    return up_keys_path(data_dir)


def _read(path: Path) -> dict[str, str]:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {k: v for k in KINDS if isinstance(v := stored.get(k), str)}


def _write(path: Path, keys: dict[str, str]) -> None:
    """Replace the file atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(keys, fh, indent=2)
        fh.write("\n")
    os.chmod(tmp, 0o600)  # also when the file was there with other bits
    os.replace(tmp, path)


def up_keys(db: Session, data_dir: Path, project: str, *, new: bool = False) -> UpKeys:
    """The keys to print: the kept ones while usable, else fresh ones (written back)."""
    path = keys_path(data_dir)
    stored = _read(path)
    out: dict[str, str] = {}
    for kind in KINDS:
        secret = stored.get(kind)
        row = find_key(db, secret) if secret else None
        usable = (
            row is not None
            and row.kind == kind
            and row.project_id == project
            and key_usable(db, row)
        )
        if usable and not new:
            out[kind] = str(secret)
            continue
        if row is not None and row.revoked_at is None:
            revoke_key(db, row.id, actor="rlgate up")
        _, out[kind] = create_key(db, project, kind, name="rlgate up")
    if out != stored or not path.exists():
        _write(path, out)
    return UpKeys(out["agent"], out["admin"], reused=out == stored)
