"""What `rlgate config` prints: each effective setting, as the running stack uses it,
with where its value comes from (default, file, environment, up)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from core.settings import ENV_PREFIX, Settings
from rlgate.stack import APPLIED, StackInfo


def _file_keys() -> set[str]:
    path = os.environ.get("RLGATE_CONFIG")
    if not path:
        return set()
    try:
        return set(tomllib.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return set()


def origin(name: str, file_keys: set[str]) -> str:
    var = f"{ENV_PREFIX}{name.upper()}"
    if var in APPLIED:
        return "up"
    if var in os.environ:
        return "environment"
    return "file" if name in file_keys else "default"


def view(settings: Settings, stack: StackInfo | None, up_cap: str) -> dict[str, tuple[str, str]]:
    """name -> (value, origin), secrets masked, the data dir absolute. ``up_cap`` is the
    output cap `rlgate up` sets for requests naming none (empty when it sets none)."""
    file_keys = _file_keys()
    absolute = settings.model_copy(update={"data_dir": settings.data_dir.expanduser().resolve()})
    values = absolute.masked()  # the data dir, and the SQLite paths under it, absolute
    out = {name: (value, origin(name, file_keys)) for name, value in values.items()}
    if not values["default_max_tokens"] and up_cap:
        out["default_max_tokens"] = (up_cap, "up")
    if not values["admin_key"] and stack is not None and Path(stack.admin_key_file).exists():
        out["admin_key"] = (f"******** (in {stack.admin_key_file})", "up")
    return out
