"""The agents of the SWE example, each run in a task's repository with a per-session key:
mini-swe-agent (OpenAI Chat Completions through litellm), Claude Code (Anthropic
Messages), or the reference fix (one model call, then the task's known fix)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from swe_tasks import Task, apply_fix

CLAUDE_SYSTEM = (
    "You fix bugs in small Python repositories. Use the Bash tool to read files, edit them "
    "and run the tests. Keep answers short."
)


@dataclass
class AgentResult:
    exit_status: str
    calls: int | None
    seconds: float
    log_path: Path


def agent_env(extra: dict[str, str]) -> dict[str, str]:
    """The agent's environment: ours without rlgate's settings (no admin key, no database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGATE_")}
    env.update(extra)
    return env


def run_mini(
    args: argparse.Namespace, task: Task, repo: Path, out: Path, base: str, key: str
) -> AgentResult:
    traj = out / "mini.traj.json"
    cmd = [
        args.mini,
        "--agent-class", "default",  # not the interactive agent: never prompts
        "-m", args.model,
        "-t", task.prompt(),
        "-c", args.mini_config,
        "-c", f"agent.step_limit={args.steps}",
        "-c", "agent.cost_limit=0",
        "-c", f"agent.wall_time_limit_seconds={args.agent_timeout}",
        "-c", f"environment.cwd={repo}",
        "-c", "environment.timeout=30",
        "-c", f"model.model_kwargs.api_base={base}/v1",
        "-c", f"model.model_kwargs.max_tokens={args.max_tokens}",
        "-c", f"model.model_kwargs.temperature={args.temperature}",
        "-o", str(traj),
    ]  # fmt: skip
    env = agent_env(
        {
            "OPENAI_API_KEY": key,  # the per-session key: every call lands in this session
            "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
            "MSWEA_GLOBAL_CONFIG_DIR": str(out / "mini-config"),
            "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download at import
            "PAGER": "cat",
        }
    )
    result = _run_agent(cmd, env, out / "agent.log", args.agent_timeout + 120)
    if traj.is_file():
        info = json.loads(traj.read_text()).get("info", {})
        result.exit_status = info.get("exit_status") or result.exit_status
        result.calls = info.get("model_stats", {}).get("api_calls")
    return result


def run_claude(
    args: argparse.Namespace, task: Task, repo: Path, out: Path, base: str, key: str
) -> AgentResult:
    cmd = [
        args.claude, "-p", task.prompt(),
        "--bare",
        "--system-prompt", CLAUDE_SYSTEM,
        "--tools", args.claude_tools,
        "--allowedTools", args.claude_tools,  # pre-approved: no permission prompts
        "--max-turns", str(args.steps),
        "--output-format", "json",
    ]  # fmt: skip
    home = out / "claude-home"
    home.mkdir(exist_ok=True)
    env = agent_env(
        {
            "ANTHROPIC_BASE_URL": base,  # no /v1: Claude Code adds it
            "ANTHROPIC_AUTH_TOKEN": key,  # the per-session key
            "HOME": str(home),  # its own ~/.claude, not yours
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(args.max_tokens),
        }
    )
    result = _run_agent(cmd, env, out / "agent.log", args.agent_timeout, cwd=repo)
    try:  # the last line is Claude Code's JSON result
        last = json.loads(result.log_path.read_text().strip().splitlines()[-1])
        status = "error" if last.get("is_error") else str(last.get("subtype") or "")
        result.exit_status = status or result.exit_status
    except (ValueError, IndexError, AttributeError):
        pass
    return result


def run_reference(
    args: argparse.Namespace, task: Task, repo: Path, out: Path, base: str, key: str
) -> AgentResult:
    """Not an agent: one model call (so the session has a turn to rate), then the task's
    reference fix. Checks the positive path: tests pass -> the verifier rewards +1."""
    t0 = time.monotonic()
    body = {
        "model": args.model.split("/", 1)[-1],
        "messages": [{"role": "user", "content": task.prompt()}],
        "max_tokens": 32,
    }
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    )
    (out / "agent.log").write_text(r.text)
    r.raise_for_status()
    apply_fix(task, repo)
    return AgentResult("reference fix", 1, time.monotonic() - t0, out / "agent.log")


def _run_agent(
    cmd: list[str], env: dict[str, str], log_path: Path, timeout: float, cwd: Path | None = None
) -> AgentResult:
    t0 = time.monotonic()
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
            status = f"exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
    return AgentResult(status, None, time.monotonic() - t0, log_path)


AGENTS = {"mini": run_mini, "claude": run_claude, "reference": run_reference}
AGENT_NAMES = {"mini": "mini-swe-agent", "claude": "claude-code", "reference": "reference-fix"}
