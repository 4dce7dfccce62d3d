"""What `rlgate up` prints and writes, without starting a stack: snippets that run as
printed (the Python heredoc compiles, the Claude Code line parses with the prompt where
Claude Code reads it), the training trigger from the trainer's own settings, the Codex and
OpenClaw configurations filled in, the kept keys (real SQLite), and a busy port refused
in one line before anything is written."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from rlgate.up_clients import write_client_files
from rlgate.up_snippets import claude_line, python_path, rlgate_path, snippets, training_note
from tests.servers import free_port
from trainer.config import TrainConfig

BASE = "http://127.0.0.1:8123"
KEY = "rlg_agent_" + "x" * 43


def block(text: str, title: str) -> str:
    """The lines to paste under ``title``: after the title (and its indented continuation
    lines), up to the next blank line."""
    lines = text.split(title, 1)[1].splitlines()[1:]
    while lines and lines[0].startswith("  "):
        lines.pop(0)
    out = []
    for line in lines:
        if not line.strip():
            break
        out.append(line)
    return "\n".join(out)


def _printed(tmp_path: Path) -> tuple[str, object]:
    files = write_client_files(tmp_path, BASE, KEY, 2048)
    return snippets(BASE, KEY, "rlgate-policy", files), files


def test_the_python_snippet_is_a_heredoc_for_this_python_that_compiles(tmp_path):
    text, _ = _printed(tmp_path)
    sdk = block(text, "OpenAI SDK (Python")
    first, *body, last = sdk.splitlines()
    assert first == f"{shlex.quote(python_path())} - <<'EOF'" and last == "EOF"
    assert Path(shlex.split(first)[0]).is_absolute() and Path(python_path()).exists()
    code = "\n".join(body)
    assert not body[0][0].isspace()  # pasted as it stands: no IndentationError
    compile(code, "<snippet>", "exec")
    assert f'base_url="{BASE}/v1"' in code and f'api_key="{KEY}"' in code
    # the shell hands the heredoc to Python unchanged (run with -m py_compile's check)
    checked = sdk.replace(
        f"{shlex.quote(python_path())} -",
        f'{shlex.quote(sys.executable)} -c \'import sys; compile(sys.stdin.read(), "s", "exec")\' ',
        1,
    )
    r = subprocess.run(["bash", "-c", checked], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # every pasted block starts at column 0
    for title in (
        "OpenAI SDK (Python",
        "curl (",
        "Claude Code (",
        "Codex (",
        "OpenClaw (",
        "Rate that answer",
    ):
        assert not block(text, title)[0].isspace(), title


class _Gateway(BaseHTTPRequestHandler):
    """Answers a chat call with a fresh id and records the feedback it gets (the wire
    shapes of /v1/chat/completions and /feedback, as curl and the shell see them)."""

    answered: list[str] = []
    rated: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.headers["Authorization"] == f"Bearer {KEY}"
        if self.path == "/v1/chat/completions":
            rid = f"chatcmpl-{len(self.answered)}abc"
            self.answered.append(rid)
            out = {"id": rid, "choices": [{"message": {"content": "Hi there"}}]}
        else:
            self.rated.append(body)
            out = {"ok": True}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_the_rating_snippet_rates_the_answer_the_curl_snippet_just_printed(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        text = snippets(base, KEY, "rlgate-policy", None)
        pasted = block(text, "curl (") + "\n" + block(text, "Rate that answer")
        r = subprocess.run(["bash", "-c", pasted], capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr
    assert "Hi there" in r.stderr and f"id: {_Gateway.answered[-1]}" in r.stdout
    assert _Gateway.rated == [
        {"interaction_id": _Gateway.answered[-1], "value": 1, "scale": "binary"}
    ]


def test_the_claude_code_line_gives_the_prompt_before_the_tools_list():
    """Claude Code's ``--tools`` takes a list (``<tools...>``): every word after it up to
    the next option is a tool name, so the prompt must not follow it."""
    argv = shlex.split(claude_line(BASE, KEY))
    env = argv[: argv.index("claude")]
    assert env == [f"ANTHROPIC_BASE_URL={BASE}", f"ANTHROPIC_AUTH_TOKEN={KEY}"]
    args = argv[argv.index("claude") + 1 :]
    assert args[:2] == ["-p", "Hello!"]
    assert args[-2:] == ["--tools", ""]  # nothing after the list
    assert args[args.index("--system-prompt") + 1] == "You are a helpful assistant."
    assert "--bare" in args


def test_paths_are_absolute_and_rlgate_is_beside_this_python():
    rlgate = rlgate_path()
    first = shlex.split(rlgate)[0]
    assert Path(first).is_absolute()
    beside = Path(python_path()).parent / "rlgate"
    if beside.exists():
        assert rlgate == str(beside)
    r = subprocess.run([*shlex.split(rlgate), "version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("rlgate "), r.stderr


def test_the_training_trigger_comes_from_the_trainer_settings(tmp_path):
    default = TrainConfig()
    note = training_note(default, "/x/rlgate", "default", tmp_path)
    assert f"when {default.threshold} rated answers wait" in note
    assert f"every {default.schedule_minutes:g} minutes" in note
    assert f"RLGATE_DATA_DIR={tmp_path} /x/rlgate train --project default" in note
    tuned = TrainConfig.from_project_settings({"training": {"threshold": 8, "schedule_minutes": 5}})
    assert "when 8 rated answers wait, or every 5 minutes" in training_note(
        tuned, "rlgate", "p", tmp_path
    )


def test_codex_and_openclaw_configurations_are_filled_in(tmp_path):
    text, files = _printed(tmp_path)
    assert files is not None
    codex = tomllib.loads(files.codex_config.read_text())
    assert codex["model_providers"]["rlgate"]["base_url"] == f"{BASE}/v1"
    assert codex["model_providers"]["rlgate"]["env_key"] == "RLGATE_API_KEY"
    assert codex["model_context_window"] == 2048
    assert Path(codex["model_instructions_file"]).read_text().strip()
    assert "__" not in files.codex_config.read_text()

    oc = json.loads(files.openclaw_config.read_text())
    provider = oc["models"]["providers"]["rlgate"]
    assert provider["baseUrl"] == f"{BASE}/v1" and provider["apiKey"] == KEY
    assert provider["models"][0]["contextWindow"] == 2048
    assert stat.S_IMODE(files.openclaw_config.stat().st_mode) == 0o600  # it holds the key
    assert files.openclaw_config == files.openclaw_home / ".openclaw" / "openclaw.json"

    # the printed lines point each client at its file
    codex_line = block(text, "Codex (")
    assert f"CODEX_HOME={files.codex_home}" in codex_line and f"RLGATE_API_KEY={KEY}" in codex_line
    assert str(files.codex_config) in text and str(files.openclaw_config) in text
    assert block(text, "OpenClaw (").startswith(f"OPENCLAW_HOME={files.openclaw_home} openclaw")


def test_up_keys_are_kept_reused_and_replaced_on_demand(tmp_path):
    from core.db import make_engine, session_factory, transaction
    from core.keys import lookup_key, revoke_key
    from core.migrate import upgrade
    from rlgate.up_keys import keys_path, up_keys

    url = f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url)
    factory = session_factory(make_engine(url))
    with transaction(factory) as db:
        first = up_keys(db, tmp_path, "default")
    assert not first.reused
    assert first.agent.startswith("rlg_agent_") and first.admin.startswith("rlg_admin_")
    path = keys_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"agent": first.agent, "admin": first.admin}

    with transaction(factory) as db:  # a restart
        again = up_keys(db, tmp_path, "default")
    assert again.reused and (again.agent, again.admin) == (first.agent, first.admin)

    with transaction(factory) as db:  # --new-keys: the old ones stop working
        fresh = up_keys(db, tmp_path, "default", new=True)
    assert fresh.agent != first.agent and fresh.admin != first.admin
    with factory() as db:
        assert lookup_key(db, first.agent) is None and lookup_key(db, first.admin) is None
        assert lookup_key(db, fresh.agent).kind == "agent"
        admin_row = lookup_key(db, fresh.admin)
        assert admin_row is not None
    assert json.loads(path.read_text())["agent"] == fresh.agent

    with transaction(factory) as db:  # a kept key revoked meanwhile is replaced, alone
        revoke_key(db, admin_row.id)
    with transaction(factory) as db:
        after = up_keys(db, tmp_path, "default")
    assert after.agent == fresh.agent and after.admin != fresh.admin and not after.reused

    other = tmp_path / "other"  # a database that does not know the kept keys
    other.mkdir()
    path.replace(other / path.name)
    url2 = f"sqlite:///{tmp_path / 'k2.db'}"
    upgrade(url2)
    with transaction(session_factory(make_engine(url2))) as db:
        moved = up_keys(db, other, "default")
    assert not moved.reused and moved.agent != fresh.agent


def test_a_busy_port_is_one_line_exit_2_before_anything_is_written(tmp_path):
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    busy = listening.getsockname()[1]
    data = tmp_path / "data"
    env = {**os.environ, "RLGATE_DATA_DIR": str(data)}
    try:
        for flag, other in (("--port", "--engine-port"), ("--engine-port", "--port")):
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rlgate.cli",
                    "up",
                    flag,
                    str(busy),
                    other,
                    str(free_port()),
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert r.returncode == 2, r.stderr
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1, r.stderr
            assert lines[0].startswith("rlgate: error: port ") and flag in lines[0], lines
            assert re.search(rf"\b{busy}\b", lines[0])
            assert not data.exists()  # nothing migrated, nothing started
    finally:
        listening.close()


def test_up_help_names_new_keys():
    from click.testing import CliRunner

    from rlgate.cli import main

    out = CliRunner().invoke(main, ["up", "--help"]).output
    assert "--new-keys" in out and "up-keys.json" in out


def test_without_the_templates_no_files_are_written_and_the_snippets_say_so(tmp_path, monkeypatch):
    import rlgate.up_clients as clients

    monkeypatch.setattr(clients, "TEMPLATES", tmp_path / "nowhere")
    assert write_client_files(tmp_path, BASE, KEY, 2048) is None
    text = snippets(BASE, KEY, "m", None)
    assert "no configuration was written" in text
    assert block(text, "Claude Code (").count("\n") == 0  # the note is its own paragraph
