"""Which agent sent a call, from the headers its client sends (``agent_of``): the one place
that maps a client's headers to the ``agent_name`` of its session, shown in the
dashboard's sessions list. A call's own ``metadata.agent_name`` wins over this.

The header shapes, as these clients send them:
- Claude Code: ``User-Agent: claude-cli/<version> (external, cli)`` (also
  ``X-App: cli``);
- Codex CLI: ``originator: codex_cli_rs`` (``codex_exec`` for ``codex exec``) and
  ``User-Agent: <originator>/<version> (<os>; <arch>) <terminal>``;
- OpenClaw: its model calls go through the OpenAI JS SDK (``User-Agent: OpenAI/JS ...``,
  nothing of its own) unless its provider config adds headers; the template rlgate ships
  (docs/clients/openclaw.json) adds ``X-Title: OpenClaw``, the attribution header OpenClaw
  itself sends to OpenRouter. A ``User-Agent`` naming openclaw counts too.
"""

from __future__ import annotations

from collections.abc import Mapping

CLAUDE_CODE = "claude-code"
CODEX = "codex"
OPENCLAW = "openclaw"


def agent_of(headers: Mapping[str, str]) -> str | None:
    """The agent these request headers name (``claude-code``, ``codex``, ``openclaw``),
    or None for any other client. ``headers``: case-insensitive (Starlette's Headers),
    or a dict with lower-case names."""
    ua = (headers.get("user-agent") or "").strip().lower()
    originator = (headers.get("originator") or "").strip().lower()
    title = (headers.get("x-title") or "").strip().lower()
    if ua.startswith("claude-cli/"):
        return CLAUDE_CODE
    if originator.startswith("codex") or ua.startswith(("codex_", "codex-")):
        return CODEX
    if "openclaw" in ua or title.startswith("openclaw"):
        return OPENCLAW
    return None
