"""Hermes Agent run once per task (``hermes -z``) from a private HERMES_HOME: the example's
config.yaml, SOUL.md and the calc_tools plugin; the tools it called and its usage are read
back from files the plugin and Hermes write."""

from __future__ import annotations

import json
import os
import shutil
import signal
import string
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass
class HermesRun:
    answer: str
    exit_code: int
    seconds: float
    tool_calls: list[dict[str, Any]]
    usage: dict[str, Any]
    stderr: str


class Hermes:
    """A private HERMES_HOME (config.yaml, SOUL.md, the calc_tools plugin) and the
    ``hermes -z`` one-shot runner. Nothing under the user's home is touched."""

    def __init__(
        self, binary: str, base_url: str, max_tokens: int, max_turns: int, stop: str
    ) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="rlgate-hermes-"))
        self.home = self.root / "hermes-home"
        self.workdir = self.root / "work"  # cwd without AGENTS.md etc.
        self.workdir.mkdir(parents=True)
        (self.home / "plugins").mkdir(parents=True)
        template = string.Template((HERE / "hermes_config.yaml").read_text())
        config = template.substitute(
            base_url=base_url.rstrip("/"),
            max_tokens=max_tokens,
            max_turns=max_turns,
            extra_body=json.dumps({"stop": [stop]} if stop else {}),
        )
        (self.home / "config.yaml").write_text(config)
        shutil.copy(HERE / "SOUL.md", self.home / "SOUL.md")
        shutil.copytree(
            HERE / "hermes_plugin" / "calc_tools",
            self.home / "plugins" / "calc_tools",
            ignore=shutil.ignore_patterns("__pycache__"),
        )

    def run(self, prompt: str, session_key: str, index: int, timeout_s: float) -> HermesRun:
        tool_log = self.root / f"tools-{index:04d}.jsonl"
        usage_file = self.root / f"usage-{index:04d}.json"
        # not the project's venv, and none of this script's keys: only the session's
        drop = ("PYTHONPATH", "VIRTUAL_ENV", "RLGATE_AGENT_KEY", "RLGATE_EXAMPLE_ADMIN_KEY")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(
            HERMES_HOME=str(self.home),
            HOME=str(self.root),  # belt and braces: nothing lands in the real home
            RLGATE_SESSION_KEY=session_key,
            CALC_TOOLS_LOG=str(tool_log),
        )
        cmd = [self.binary, "-z", prompt, "--toolsets", "calc", "--usage-file", str(usage_file)]
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(killed after {timeout_s:.0f} s)"
        except BaseException:  # Ctrl-C / SIGTERM: leave no Hermes behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        seconds = time.monotonic() - started
        calls = []
        if tool_log.exists():
            calls = [json.loads(line) for line in tool_log.read_text().splitlines() if line]
        usage: dict[str, Any] = {}
        if usage_file.exists():
            usage = json.loads(usage_file.read_text())
        return HermesRun(out.strip(), proc.returncode, seconds, calls, usage, err.strip())

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
