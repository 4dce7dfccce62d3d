"""How every `rlgate` command finds the stack `rlgate up` runs (rlgate/stack.py): stale
stack files are ignored, several running stacks need a choice, none found and no database
is one line and exit 2 with nothing created, and from any directory the commands act on
the running stack with its engine key. The last test runs a real `rlgate up`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.settings import ConfigError
from rlgate import stack
from rlgate.stack import StackInfo
from tests.rlgate.test_up import _start, _stop
from tests.servers import MODEL_CACHE, REPO, free_port


def _info(data_dir: Path, pid: int, key: str = "engine-key") -> StackInfo:
    return StackInfo(
        data_dir=str(data_dir),
        database_url=f"sqlite:///{data_dir}/rlgate.db",
        engine_urls="http://127.0.0.1:1",
        engine_api_key=key,
        gateway_url="http://127.0.0.1:2",
        admin_key_file=str(data_dir / "up-keys.json"),
        default_max_tokens="512",
        pid=pid,
    )


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Live pids that stand for running `rlgate up` processes."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])]
    procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    base = {k: v for k, v in os.environ.items() if k != "RLGATE_DATA_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "rlgate.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=timeout,
    )


def test_stack_file_is_private_and_a_stale_one_is_ignored(tmp_path, sleepers):
    path = stack.write(_info(tmp_path / "a", sleepers[0]))
    assert (path.stat().st_mode & 0o777) == 0o600
    assert path.parent == tmp_path / "state" / "rlgate" / "stacks"
    stack.write(_info(tmp_path / "b", _dead_pid()))
    assert [s.data_dir for s in stack.running()] == [str(tmp_path / "a")]
    stack.remove(path)
    assert stack.running() == []


def test_several_stacks_need_a_choice(tmp_path, sleepers):
    a, b = tmp_path / "a" / "rlgate-data", tmp_path / "b"
    stack.write(_info(a, sleepers[0]))
    stack.write(_info(b, sleepers[1]))
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(ConfigError) as e:
        stack.choose({}, elsewhere)
    assert str(a) in str(e.value) and str(b) in str(e.value)
    assert "RLGATE_DATA_DIR" in str(e.value) and "--data-dir" in str(e.value)
    assert stack.choose({"RLGATE_DATA_DIR": str(b)}, elsewhere).data_dir == str(b)
    assert stack.choose({}, tmp_path / "a").data_dir == str(a)  # ./rlgate-data wins
    assert stack.choose({"RLGATE_DATABASE_URL": "sqlite:///x.db"}, elsewhere) is None

    # the CLI says the same in one line, exit 2, no traceback
    out = _cli("adapters", "list", cwd=tmp_path)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "2 rlgate stacks run" in out.stderr, out.stderr


def test_no_stack_and_no_database_creates_nothing(tmp_path):
    cwd = tmp_path / "work"
    cwd.mkdir()
    for args in (("adapters", "list"), ("train", "--once"), ("adapters", "rollback")):
        out = _cli(*args, cwd=cwd)
        assert out.returncode == 2, (args, out)
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert "no running rlgate stack" in out.stderr and "bash scripts/up" in out.stderr
    assert list(cwd.iterdir()) == []
    assert not (tmp_path / "state").exists()


def test_commands_from_another_directory_adopt_the_single_stack(tmp_path, sleepers):
    from core import migrate

    data = tmp_path / "stack" / "rlgate-data"
    data.mkdir(parents=True)
    info = _info(data, sleepers[0], key="the-stacks-key")
    migrate.upgrade(info.database_url)
    stack.write(info)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = _cli("adapters", "list", cwd=cwd)
    assert out.returncode == 0, out
    assert f"acting on the stack of `rlgate up` (pid {sleepers[0]}) with data in {data}" in (
        out.stderr
    )
    cfg = _cli("config", "--json", cwd=cwd)
    assert cfg.returncode == 0, cfg
    shown = json.loads(cfg.stdout)
    assert shown["data_dir"] == str(data) and shown["origins"]["data_dir"] == "up"
    assert shown["engine_api_key"] == "********" and "the-stacks-key" not in cfg.stdout
    assert shown["origins"]["engine_api_key"] == "up"
    assert shown["default_max_tokens"] == "512"
    assert shown["origins"]["gateway_port"] == "default"
    # explicit settings win over the stack's
    cfg = _cli("config", "--json", cwd=cwd, env={"RLGATE_DEFAULT_MAX_TOKENS": "64"})
    shown = json.loads(cfg.stdout)
    assert shown["default_max_tokens"] == "64"
    assert shown["origins"]["default_max_tokens"] == "environment"
    assert list(cwd.iterdir()) == []


def test_commands_act_on_a_real_running_up_from_another_directory(tmp_path):
    """`rlgate up` runs; from another directory, with no RLGATE_* setting, `adapters
    list`, `train --once` (which publishes with the stack's engine key) and `config` act on
    it. The stack file exists (0600) while it runs and is gone after Ctrl-C."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(MODEL_CACHE / "models")  # no second conversion
    port, engine_port = free_port(), free_port()
    proc, out = _start(tmp_path, data, port, engine_port, "--no-trainer")
    files = list((tmp_path / "state" / "rlgate" / "stacks").glob("*.json"))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    try:
        assert len(files) == 1 and (files[0].stat().st_mode & 0o777) == 0o600
        recorded = json.loads(files[0].read_text())
        assert recorded["data_dir"] == str(data.resolve()) and recorded["pid"] == proc.pid

        listed = _cli("adapters", "list", cwd=cwd)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
        assert f"with data in {data.resolve()}" in listed.stderr

        # one answer, rated, so that `train --once` has something to train on
        base = f"http://127.0.0.1:{port}"
        key = re.search(r"agent key:\s+(\S+)", out).group(1)  # type: ignore[union-attr]
        auth = {"Authorization": f"Bearer {key}"}
        body = {"model": "rlgate-policy", "messages": [{"role": "user", "content": "Hi"}]}
        body["max_tokens"] = 8
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, headers=auth, timeout=300)
        assert answer.status_code == 200, answer.text
        rating = {"interaction_id": answer.json()["id"], "value": 1, "scale": "binary"}
        r = httpx.post(f"{base}/feedback", json=rating, headers=auth, timeout=60)
        assert r.status_code < 300, r.text
        trained = _cli("train", "--once", cwd=cwd, timeout=900)
        assert trained.returncode == 0 and "Traceback" not in trained.stderr, trained
        assert json.loads(trained.stdout.splitlines()[-1])["status"] == "published", trained
        listed = _cli("adapters", "list", cwd=cwd)
        assert listed.returncode == 0 and re.search(r"\bv1\b", listed.stdout), listed
        back = _cli("adapters", "rollback", "base", cwd=cwd)  # project default
        assert back.returncode == 0 and "Traceback" not in back.stderr, back
        assert json.loads(back.stdout)["name"] == "base", back

        cfg = _cli("config", cwd=cwd)
        assert cfg.returncode == 0 and "Traceback" not in cfg.stderr, cfg
        assert re.search(
            rf"RLGATE_DATA_DIR\s+{re.escape(str(data.resolve()))}\s+\(up\)", cfg.stdout
        )
        assert re.search(r"RLGATE_ENGINE_API_KEY\s+\*+\s+\(up\)", cfg.stdout), cfg.stdout
        assert re.search(r"RLGATE_DEFAULT_MAX_TOKENS\s+512\s+\(up\)", cfg.stdout), cfg.stdout
        assert list(cwd.iterdir()) == []
    finally:
        _stop(proc, out)
    assert not files[0].exists()
