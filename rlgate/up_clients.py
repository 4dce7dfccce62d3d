"""Ready-to-use client configurations `rlgate up` writes under ``<data dir>/clients/``.

They are the templates of docs/clients/ (the ones scripts/try_clients.sh runs Codex and
OpenClaw with) with their placeholders filled in: this gateway's base URL, the agent key
(OpenClaw's config holds it, so its file is mode 0600; Codex reads it from
``RLGATE_API_KEY``), and the context length the gateway reports on ``/v1/models``.

- Codex: ``<data dir>/clients/codex/config.toml`` (+ ``instructions.md``); point Codex at
  it with ``CODEX_HOME=<data dir>/clients/codex``.
- OpenClaw: ``<data dir>/clients/openclaw/.openclaw/openclaw.json``; point OpenClaw at it
  with ``OPENCLAW_HOME=<data dir>/clients/openclaw`` (OpenClaw's home for all its paths;
  ``HOME=`` works too, as try_clients.sh runs it).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent.parent / "docs" / "clients"
TEMPLATE_CONTEXT = 4096  # the context window the templates are written for


@dataclass(frozen=True)
class ClientFiles:
    codex_home: Path
    codex_config: Path
    openclaw_home: Path
    openclaw_config: Path


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def codex_config(base: str, instructions: Path, context_length: int) -> str:
    text = (TEMPLATES / "codex-config.toml").read_text()
    text = text.replace("__BASE_URL__", base).replace("__INSTRUCTIONS_FILE__", str(instructions))
    return re.sub(
        r"^model_context_window = \d+", f"model_context_window = {context_length}", text, flags=re.M
    )


def openclaw_config(base: str, agent_key: str, context_length: int) -> str:
    text = (TEMPLATES / "openclaw.json").read_text()
    text = text.replace("__BASE_URL__", base).replace("__AGENT_KEY__", agent_key)
    config = json.loads(text)
    for provider in config["models"]["providers"].values():
        for model in provider["models"]:
            model["contextWindow"] = context_length
    return json.dumps(config, indent=2) + "\n"


def write_client_files(
    data_dir: Path, base: str, agent_key: str, context_length: int | None
) -> ClientFiles | None:
    """Write both configurations (replacing earlier ones); None when the templates are not
    there (rlgate installed without its repository)."""
    if not (TEMPLATES / "codex-config.toml").is_file():
        return None
    ctx = context_length or TEMPLATE_CONTEXT
    root = data_dir / "clients"
    codex_home = root / "codex"
    instructions = codex_home / "instructions.md"
    _write(instructions, (TEMPLATES / "codex-instructions.md").read_text())
    _write(codex_home / "config.toml", codex_config(base, instructions, ctx))
    openclaw_home = root / "openclaw"
    oc_file = openclaw_home / ".openclaw" / "openclaw.json"
    _write(oc_file, openclaw_config(base, agent_key, ctx), mode=0o600)  # holds the key
    return ClientFiles(codex_home, codex_home / "config.toml", openclaw_home, oc_file)
