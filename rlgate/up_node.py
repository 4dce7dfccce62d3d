"""OpenClaw needs Node >= 24.16: `rlgate up` says, in one line, when the node on PATH is
older (an older npm installs a placeholder `openclaw` without error)."""

from __future__ import annotations

import re
import shutil
import subprocess

OPENCLAW_NODE = (24, 16)


def node_note() -> str | None:
    """One line when node is on PATH and too old for OpenClaw, else None."""
    node = shutil.which("node")
    if node is None:
        return None
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.match(r"v?(\d+)\.(\d+)", out.stdout.strip())
    if m is None or (int(m[1]), int(m[2])) >= OPENCLAW_NODE:
        return None
    need = ".".join(map(str, OPENCLAW_NODE))
    return f"node {out.stdout.strip()} is older than OpenClaw needs (>= {need}); upgrade node first"
