"""The stack file: how every `rlgate` command finds the stack `rlgate up` runs.

`rlgate up` writes ``$XDG_STATE_HOME/rlgate/stacks/<pid>.json`` (default
``~/.local/state``; mode 0600: it holds the engine key) naming its absolute data dir,
database URL, engine URLs and key, gateway URL, the admin key's file, the default output
cap and its pid, and removes it on a clean exit. A file whose pid is dead is stale and
ignored.

A command that touches the database or the engine (``adopt``) picks the stack: one whose
data dir is RLGATE_DATA_DIR (or ``rlgate --data-dir``) when that is set; with
RLGATE_DATABASE_URL set, none (explicit settings win); else the one whose data dir is the
working directory's ./rlgate-data; else the only one running. Several running and none
chosen: one line naming them and how to pick, exit 2. The chosen stack's values become
RLGATE_* variables of this process for every one not already set, and one line on stderr
names it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from core.settings import ConfigError
from trainer.runs import pid_alive

# RLGATE_* variables a stack hands to the commands that act on it (each set only where
# the environment does not set it already); the names `rlgate config` reports as from `up`
APPLIED: set[str] = set()


@dataclass(frozen=True)
class StackInfo:
    data_dir: str
    database_url: str
    engine_urls: str
    engine_api_key: str
    gateway_url: str
    admin_key_file: str
    default_max_tokens: str
    pid: int

    def env(self) -> dict[str, str]:
        values = {
            "RLGATE_DATA_DIR": self.data_dir,
            "RLGATE_DATABASE_URL": self.database_url,
            "RLGATE_ENGINE_URLS": self.engine_urls,
            "RLGATE_ENGINE_API_KEY": self.engine_api_key,
            "RLGATE_DEFAULT_MAX_TOKENS": self.default_max_tokens,
        }
        return {k: v for k, v in values.items() if v}

    def describe(self) -> str:
        return f"the stack of `rlgate up` (pid {self.pid}) with data in {self.data_dir}"


ADOPTED: list[StackInfo] = []  # the stack this process acts on (at most one)


def stacks_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "rlgate" / "stacks"


def write(info: StackInfo) -> Path:
    """Write ``info`` as this stack's file (0600); returns its path for ``remove``."""
    folder = stacks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{info.pid}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(info), fh, indent=2)
    return path


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def running() -> list[StackInfo]:
    """The stacks whose `rlgate up` still runs, oldest pid first (stale files ignored)."""
    found = []
    folder = stacks_dir()
    if not folder.is_dir():
        return []
    for path in sorted(folder.glob("*.json")):
        try:
            info = StackInfo(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if pid_alive(info.pid):
            found.append(info)
    return sorted(found, key=lambda s: s.pid)


def _same(a: str | Path, b: str | Path) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def choose(env: dict[str, str], cwd: Path) -> StackInfo | None:
    """The stack a command acts on (the module's rules), or None; ConfigError when
    several run and nothing says which."""
    stacks = running()
    chosen = env.get("RLGATE_DATA_DIR")
    if chosen:
        return next((s for s in stacks if _same(s.data_dir, chosen)), None)
    if env.get("RLGATE_DATABASE_URL"):
        return None
    here = cwd / "rlgate-data"
    local = next((s for s in stacks if _same(s.data_dir, here)), None)
    if local or len(stacks) <= 1:
        return local or (stacks[0] if stacks else None)
    names = ", ".join(s.data_dir for s in stacks)
    raise ConfigError(
        f"{len(stacks)} rlgate stacks run (data in {names}); pick one with "
        "`rlgate --data-dir DIR ...` or RLGATE_DATA_DIR=DIR"
    )


def adopt() -> StackInfo | None:
    """Choose the stack for this process and set its values as RLGATE_* variables where
    the environment sets none; returns it (the caller names it on stderr)."""
    info = choose(dict(os.environ), Path.cwd())
    if info is None:
        return None
    for name, value in info.env().items():
        if name not in os.environ:
            os.environ[name] = value
            APPLIED.add(name)
    ADOPTED[:] = [info]
    return info
