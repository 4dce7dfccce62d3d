"""What `rlgate up` prints for the newcomer: where `rlgate` lives, when training runs, and
copy-paste snippets that run as printed.

Every snippet is a title line (two spaces in, ending with ``:``) followed by the lines to
paste, unindented, up to the next blank line: absolute paths to this installation's
Python and ``rlgate`` (a fresh shell has neither on its PATH), a Python heredoc that a
shell runs as it stands, and no command whose arguments a pasted prompt could be taken
for (Claude Code's ``--tools`` takes a list, so the prompt comes before it).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlgate.up import PACKAGED_MAX_TOKENS
from rlgate.up_clients import ClientFiles

if TYPE_CHECKING:
    from trainer.config import TrainConfig


def python_path() -> str:
    """This installation's Python, as invoked (a venv's ``bin/python`` is a symlink whose
    target is not the venv: it must not be resolved)."""
    return str(Path(sys.executable).absolute())


def rlgate_path() -> str:
    """The ``rlgate`` command next to this Python (``.venv/bin/rlgate``), else the one on
    PATH, else ``python -m rlgate``."""
    beside = Path(python_path()).parent / "rlgate"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("rlgate")
    return str(Path(found).absolute()) if found else f"{shlex.quote(python_path())} -m rlgate"


def env_prefix(data_dir: Path) -> str:
    """The settings another shell needs to reach the same installation."""
    parts = [f"RLGATE_DATA_DIR={shlex.quote(str(data_dir))}"]
    config = os.environ.get("RLGATE_CONFIG")
    if config:
        parts.append(f"RLGATE_CONFIG={shlex.quote(str(Path(config).absolute()))}")
    return " ".join(parts)


def training_note(cfg: TrainConfig, rlgate: str, project: str, data_dir: Path) -> str:
    """When the trainer runs (the project's own trigger settings), and how to run it now."""
    return (
        f"  training:              when {cfg.threshold} rated answers wait, or every "
        f"{cfg.schedule_minutes:g} minutes (with at least {cfg.min_samples} waiting)\n"
        f"  train now:             {env_prefix(data_dir)} {rlgate} train --project "
        f"{shlex.quote(project)}\n"
    )


def _clients(files: ClientFiles | None, agent_key: str) -> str:
    if files is None:
        return (
            "\n  Codex and OpenClaw: the templates of docs/clients/ (in the rlgate repository) "
            "were not found,\n  so no configuration was written.\n"
        )
    codex_home = shlex.quote(str(files.codex_home))
    oc_home = shlex.quote(str(files.openclaw_home))
    return f"""
  Codex (npm install -g @openai/codex; config written to {files.codex_config},
  its prompt trimmed to fit a short context; Codex sends no output limit, so answers
  stop at RLGATE_DEFAULT_MAX_TOKENS, {PACKAGED_MAX_TOKENS} with the packaged model):
CODEX_HOME={codex_home} RLGATE_API_KEY={agent_key} codex exec --skip-git-repo-check "Say hi."

  OpenClaw (npm install -g openclaw, Node >= 24.16; config written to
  {files.openclaw_config}, its prompt trimmed to ~2k tokens):
OPENCLAW_HOME={oc_home} openclaw agent --local --message "Say hi."
"""


def claude_line(base: str, agent_key: str) -> str:
    """Claude Code in print mode with a short system prompt and no tools. The prompt comes
    right after ``-p``: ``--tools`` takes a list, so a prompt after ``--tools ""`` would be
    read as a tool name and Claude Code would find no prompt."""
    return (
        f'ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN={agent_key} claude -p "Hello!" '
        '--bare --system-prompt "You are a helpful assistant." --tools ""'
    )


def snippets(
    base: str,
    agent_key: str,
    model: str,
    files: ClientFiles | None = None,
) -> str:
    """The client snippets. The curl snippet prints the answer and keeps its id in ``$ID``;
    the rating snippet, pasted into the same shell, rates that answer."""
    python = shlex.quote(python_path())
    has_openai = importlib.util.find_spec("openai") is not None
    sdk_note = "rlgate's own Python, which has the openai package"
    if not has_openai:
        sdk_note = f"needs `{python} -m pip install openai` first"
    show = (
        "import json,sys; r=json.load(sys.stdin); "
        "print(r['choices'][0]['message']['content'], file=sys.stderr); print(r['id'])"
    )
    return f"""
  OpenAI SDK (Python; {sdk_note}):
{python} - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="{agent_key}")
answer = client.chat.completions.create(
    model="{model}", messages=[{{"role": "user", "content": "Hello!"}}]
)
print(answer.choices[0].message.content)
EOF

  curl (prints the answer, then its id, kept in $ID for the rating below):
ID=$(curl -sS {base}/v1/chat/completions -H "Authorization: Bearer {agent_key}" \\
  -H "Content-Type: application/json" \\
  -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}' \\
  | {python} -c "{show}"); echo "id: $ID"

  Rate that answer (in the same shell, after the curl above; 1 = good, 0 = bad):
curl -sS {base}/feedback -H "Authorization: Bearer {agent_key}" \\
  -H "Content-Type: application/json" \\
  -d '{{"interaction_id": "'"$ID"'", "value": 1, "scale": "binary"}}'

  Claude Code (npm install -g @anthropic-ai/claude-code; its default prompt, 21-31k
  tokens, needs a long-context policy: with the packaged model, whose context is short,
  give it a short system prompt and no tools):
{claude_line(base, agent_key)}
{_clients(files, agent_key)}"""
