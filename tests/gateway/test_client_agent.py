"""The sessions list's agent for the clients that name themselves only in headers (issue
38, item 9): gateway/edge/client_agent.py maps the headers Claude Code, Codex and OpenClaw (with
the template rlgate ships) send to ``claude-code``, ``codex``, ``openclaw``; the gateway
stores it as the new session's ``agent_name`` unless the call's ``metadata.agent_name``
says otherwise. Unit cases, then the real gateway before a fake engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory
from gateway.edge.client_agent import CLAUDE_CODE, CODEX, OPENCLAW, agent_of
from schemas.tables import InteractionRow, SessionRow
from tests.gateway.fake_engine import FastStack, fast_stack

pytestmark = pytest.mark.timeout(300)
TEMPLATE = Path(__file__).resolve().parents[2] / "docs" / "clients" / "openclaw.json"


@pytest.mark.parametrize(
    "headers,agent",
    [
        ({"user-agent": "claude-cli/2.1.197 (external, cli)", "x-app": "cli"}, CLAUDE_CODE),
        (
            {"user-agent": "claude-cli/2.0.62 (external, claude-vscode, agent-sdk/0.1.62)"},
            CLAUDE_CODE,
        ),
        (
            {
                "user-agent": "codex_cli_rs/0.58.0 (Ubuntu 24.04; x86_64) xterm-256color",
                "originator": "codex_cli_rs",
            },
            CODEX,
        ),
        (
            {"originator": "codex_exec", "user-agent": "codex_exec/0.171.0 (Debian 12; x86_64)"},
            CODEX,
        ),
        ({"user-agent": "OpenAI/JS 5.12.2", "x-title": "OpenClaw"}, OPENCLAW),
        ({"user-agent": "OpenClaw-Gateway/1.0"}, OPENCLAW),
        ({"user-agent": "OpenAI/Python 2.8.1"}, None),
        ({"user-agent": "curl/8.5.0"}, None),
        ({}, None),
    ],
)
def test_agent_of_headers(headers: dict[str, str], agent: str | None) -> None:
    assert agent_of(headers) == agent


def test_the_openclaw_template_sends_the_header() -> None:
    provider = json.loads(TEMPLATE.read_text())["models"]["providers"]["rlgate"]
    assert agent_of({k.lower(): v for k, v in provider["headers"].items()}) == OPENCLAW


@pytest.fixture(scope="module")
def fast(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastStack]:
    with fast_stack(tmp_path_factory.mktemp("agents"), model_dir) as stack:
        yield stack


def _agent_of_call(fast: FastStack, path: str, body: dict, headers: dict[str, str]) -> str | None:
    headers = {"Authorization": f"Bearer {fast.keys['p1']}", **headers}
    r = httpx.post(fast.url + path, json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    engine = make_engine(fast.app.state.gw.settings.effective_database_url)
    try:
        with session_factory(engine)() as db:
            sid = db.scalar(
                select(InteractionRow.session_id).where(InteractionRow.id == r.json()["id"])
            )
            return db.scalar(select(SessionRow.agent_name).where(SessionRow.id == sid))
    finally:
        engine.dispose()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_sessions_get_the_agent_from_headers(fast: FastStack) -> None:
    claude = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    ua = {"user-agent": "claude-cli/2.1.197 (external, cli)", "x-app": "cli"}
    assert _agent_of_call(fast, "/v1/messages", claude, ua) == CLAUDE_CODE
    codex = {"model": "m", "input": "hi", "max_output_tokens": 5}
    headers = {"originator": "codex_exec", "user-agent": "codex_exec/0.171.0 (Debian 12; x86_64)"}
    assert _agent_of_call(fast, "/v1/responses", codex, headers) == CODEX
    claw = {"user-agent": "OpenAI/JS 5.12.2", "x-title": "OpenClaw"}
    assert _agent_of_call(fast, "/v1/chat/completions", CHAT, claw) == OPENCLAW
    assert _agent_of_call(fast, "/v1/chat/completions", CHAT, {"user-agent": "curl/8"}) is None
    named = {**CHAT, "metadata": {"agent_name": "my-bot"}}  # the call's own name wins
    assert _agent_of_call(fast, "/v1/chat/completions", named, claw) == "my-bot"
