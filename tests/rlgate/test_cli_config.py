"""Settings defaults, overrides, masking, and one-line errors for bad configuration.

The commands run in this process (Click's runner: the same ``rlgate`` group, its exit
code, its stdout and stderr apart), with ``env`` set while each runs; what only a fresh
interpreter shows (which modules the command line imports) runs as a process."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from core.settings import EMBEDDED_ENGINE_URL, PACKAGED_MODEL, Settings, get_settings


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def rlgate(*args: str, env: dict | None = None) -> Ran:
    from rlgate.cli import main

    get_settings.cache_clear()  # read the settings ``env`` makes, as a new process would
    try:
        out = CliRunner().invoke(main, list(args), env=env)
    finally:
        get_settings.cache_clear()
    return Ran(out.exit_code, out.stdout, out.stderr)


def test_defaults_give_the_embedded_shape(tmp_path, monkeypatch):
    monkeypatch.delenv("RLGATE_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert str(s.data_dir) == "rlgate-data"
    assert s.effective_database_url == "sqlite:///rlgate-data/rlgate.db"
    assert s.engine_url_list == [EMBEDDED_ENGINE_URL]
    assert s.model_path == PACKAGED_MODEL and s.uses_packaged_model
    assert s.effective_broker_url.startswith("sqla+sqlite:///")


def test_env_and_config_file(tmp_path, monkeypatch):
    cfg = tmp_path / "rlgate.toml"
    cfg.write_text('engine_urls = "http://a:1, http://b:2/"\ngateway_port = 9000\n')
    monkeypatch.setenv("RLGATE_CONFIG", str(cfg))
    monkeypatch.setenv("RLGATE_GATEWAY_PORT", "9100")  # env beats the file
    s = Settings()
    assert s.engine_url_list == ["http://a:1", "http://b:2"]
    assert s.gateway_port == 9100


def test_config_masks_secrets():
    out = rlgate(
        "config",
        env={
            "RLGATE_ADMIN_KEY": "super-secret-admin",
            "RLGATE_DATABASE_URL": "postgresql://rl:hunter2@db.internal/rlgate",
            "RLGATE_BROKER_URL": "redis://:brokerpw@localhost:6379/0",
        },
    )
    assert out.returncode == 0, out.stderr
    assert "super-secret-admin" not in out.stdout and "********" in out.stdout
    assert "hunter2" not in out.stdout and "postgresql://rl:***@db.internal/rlgate" in out.stdout
    assert "brokerpw" not in out.stdout


def test_version():
    out = rlgate("version")
    assert out.returncode == 0 and out.stdout.startswith("rlgate ")


@pytest.mark.parametrize(
    "env,message",
    [
        ({"RLGATE_DATABASE_URL": "mysql://root@localhost/x"}, "scheme 'mysql' is not supported"),
        ({"RLGATE_DATABASE_URL": "not a url"}, "is not a URL"),
        (
            {"RLGATE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
            "cannot reach the database",
        ),
        ({"RLGATE_CONFIG": "/nonexistent/rlgate.toml"}, "not a file"),
        ({"RLGATE_GATEWAY_PORT": "eighty"}, "RLGATE_GATEWAY_PORT='eighty': Input should be"),
    ],
)
def test_bad_config_is_one_clear_line(env, message):
    out = rlgate("migrate", env=env)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("rlgate: error: ") and message in lines[0]


def test_keys_before_migrate_says_what_to_do():
    out = rlgate("keys", "list")
    assert out.returncode == 2 and "(nothing was created)" in out.stderr


@pytest.mark.parametrize(
    "env,message",
    [
        ({"RLGATE_DATABASE_URL": "mysql://root@localhost/x"}, "scheme 'mysql' is not supported"),
        ({"RLGATE_DATABASE_URL": "not a url"}, "is not a URL"),
        ({"RLGATE_GATEWAY_PORT": "eighty"}, "RLGATE_GATEWAY_PORT='eighty': Input should be"),
        ({"RLGATE_TOOL_PARSER": "nope"}, "RLGATE_TOOL_PARSER must be one of"),
    ],
)
def test_config_validates_like_every_command(env, message):
    """`rlgate config` shows settings, and refuses the same ones the other commands do
    (without connecting: an unreachable database is still shown)."""
    for args in (("config",), ("config", "--json")):
        out = rlgate(*args, env=env)
        assert out.returncode == 2, (args, out.stdout)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlgate: error: ") and message in lines[0]
        assert "pydantic" not in lines[0]  # the variable to set, not pydantic's field and URL
        assert out.stdout == ""


def test_config_does_not_connect():
    unreachable = rlgate("config", env={"RLGATE_DATABASE_URL": "postgresql://u@127.0.0.1:1/x"})
    assert unreachable.returncode == 0 and "postgresql://u@127.0.0.1:1/x" in unreachable.stdout


def test_the_command_line_starts_without_pytorch():
    """Registering every command (`rlgate engine`'s options included) loads no PyTorch:
    `rlgate version`, `--help` and `config` answer without its second of imports."""
    code = "import sys, rlgate.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
