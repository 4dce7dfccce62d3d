"""`rlgate up`, the README's first command: it starts the embedded stack, and the snippets
it prints work when pasted (each is run by bash exactly as printed: the OpenAI SDK heredoc,
the curl ones with the printed key, the feedback one with the real response id); the
Codex and OpenClaw configurations it writes point at it; Ctrl-C stops every process it
started; a restart prints and accepts the same keys. Real engine with the packaged model,
real Celery worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx

from tests.rlgate.test_up_snippets import block as _block
from tests.servers import MODEL_CACHE, REPO, free_port


def _start(tmp_path, data, port, engine_port, *flags: str) -> tuple[subprocess.Popen, str]:
    """`rlgate up` as a user runs it; its output up to "Press Ctrl-C to stop."."""
    env = {**os.environ, "RLGATE_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}
    args = ["up", "--port", str(port), "--engine-port", str(engine_port), *flags]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = ""
    deadline = time.monotonic() + 600
    while "Press Ctrl-C to stop." not in out:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line and proc.poll() is not None:
            raise AssertionError(f"rlgate up exited:\n{out}")
        out += line
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(out)
    return proc, out


def _stop(proc: subprocess.Popen, out: str) -> str:
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    out += rest
    assert proc.returncode == 0, out
    assert "stopped." in out
    return out


def test_up_prints_working_snippets_and_stops_cleanly(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(MODEL_CACHE / "models")  # no second conversion
    port, engine_port = free_port(), free_port()
    proc, out = _start(tmp_path, data, port, engine_port)
    try:
        base = re.search(r"base_url \(OpenAI\):\s+(\S+)", out).group(1)  # type: ignore[union-attr]
        key = re.search(r"agent key:\s+(\S+)", out).group(1)  # type: ignore[union-attr]
        assert base == f"http://127.0.0.1:{port}/v1" and key.startswith("rlg_agent_")

        # the OpenAI SDK snippet (a heredoc for rlgate's own Python), run as printed
        code = _block(out, "OpenAI SDK (Python")
        assert code.startswith("/") and not code.splitlines()[1][0].isspace()
        sdk = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=300)
        assert sdk.returncode == 0, sdk.stderr
        assert sdk.stdout.strip()

        # where rlgate lives, when it trains, and how to train now
        rlgate = re.search(r"rlgate command:\s+(\S+)", out).group(1)  # type: ignore[union-attr]
        assert os.access(rlgate, os.X_OK), out
        from trainer.config import TrainConfig

        cfg = TrainConfig()  # the trainer's defaults, as the project has no overrides
        when = f"when {cfg.threshold} rated answers wait, or every {cfg.schedule_minutes:g} minutes"
        assert re.search(rf"training:\s+{when}", out), out
        assert re.search(
            r"train now:\s+RLGATE_DATA_DIR=\S+ \S+/rlgate train --project default", out
        )
        assert re.search(r"model:\s+rlgate-policy \(\d+-token context\)", out), out

        # the Codex and OpenClaw configurations point at this gateway
        import tomllib

        codex_home = re.search(r"CODEX_HOME=(\S+)", out).group(1)  # type: ignore[union-attr]
        codex = tomllib.loads((data / "clients" / "codex" / "config.toml").read_text())
        assert codex_home == str(data.resolve() / "clients" / "codex")
        assert codex["model_providers"]["rlgate"]["base_url"] == base
        oc_home = re.search(r"OPENCLAW_HOME=(\S+)", out).group(1)  # type: ignore[union-attr]
        oc = json.loads((data / "clients" / "openclaw" / ".openclaw" / "openclaw.json").read_text())
        assert oc_home == str(data.resolve() / "clients" / "openclaw")
        assert oc["models"]["providers"]["rlgate"]["apiKey"] == key
        models = httpx.get(base + "/models", headers={"Authorization": f"Bearer {key}"}).json()
        ctx = models["data"][0]["context_length"]
        assert codex["model_context_window"] == ctx
        assert oc["models"]["providers"]["rlgate"]["models"][0]["contextWindow"] == ctx

        # the curl snippet then the rating snippet, pasted into one shell as printed: the
        # rating rates the answer the curl just printed (its id, kept in $ID)
        pasted = _block(out, "curl (") + "\n" + _block(out, "Rate that answer")
        r = subprocess.run(["bash", "-c", pasted], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        shown_id = re.search(r"^id: (chatcmpl-\S+)$", r.stdout, re.M).group(1)  # type: ignore[union-attr]
        rating = json.loads(r.stdout.split("\n", 1)[1])
        assert rating["target_id"] == shown_id, r.stdout

        # the dashboard answers
        admin = re.search(r"admin key:\s+(\S+)", out).group(1)  # type: ignore[union-attr]
        ov = httpx.get(
            f"http://127.0.0.1:{port}/admin/api/overview",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=60,
        )
        assert ov.status_code == 200

        # the engine took a fresh key (passed to the gateway and worker only): the chats
        # above went through it, a caller without the key is refused
        engine = f"http://127.0.0.1:{engine_port}"
        assert httpx.get(engine + "/v1/models", timeout=30).status_code == 401
        assert httpx.post(engine + "/abort_request", json={"abort_all": True}).status_code == 401
        assert httpx.get(engine + "/health", timeout=30).status_code == 200
    finally:
        out = _stop(proc, out)
    for p in (port, engine_port):  # nothing it started still listens
        try:
            httpx.get(f"http://127.0.0.1:{p}/health", timeout=2)
            raise AssertionError(f"port {p} still answers after rlgate up stopped")
        except httpx.TransportError:
            pass
    kept = data / "up-keys.json"
    assert (kept.stat().st_mode & 0o777) == 0o600
    assert json.loads(kept.read_text()) == {"agent": key, "admin": admin}

    # a restart prints the same keys, and they work
    proc, again = _start(tmp_path, data, port, engine_port, "--no-trainer")
    try:
        assert re.search(r"agent key:\s+(\S+)", again).group(1) == key  # type: ignore[union-attr]
        assert re.search(r"admin key:\s+(\S+)", again).group(1) == admin  # type: ignore[union-attr]
        assert f"kept from {kept.resolve()}" in again
        r = httpx.get(base + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200
    finally:
        _stop(proc, again)


def test_up_caps_output_only_for_the_packaged_model():
    from core.settings import Settings
    from rlgate.up import PACKAGED_MAX_TOKENS, _default_cap

    assert _default_cap(Settings()) == {"RLGATE_DEFAULT_MAX_TOKENS": str(PACKAGED_MAX_TOKENS)}
    assert _default_cap(Settings(default_max_tokens=64)) == {}  # the operator's value wins
    assert _default_cap(Settings(model_path="/srv/models/qwen")) == {}


def test_up_shape_needs_a_shared_database_and_broker_for_several_processes():
    import click
    import pytest
    from click.testing import CliRunner

    from core.settings import Settings
    from rlgate.cli import main
    from rlgate.up import SHARED_ERROR, Shape, check_shape, split_cores

    embedded = Settings()
    check_shape(embedded, 8000, 30000, Shape(engines=3))  # several engines: fine on SQLite
    for shape in (Shape(gateways=2), Shape(workers=2)):
        with pytest.raises(click.ClickException, match="single-process"):
            check_shape(embedded, 8000, 30000, shape)
        with pytest.raises(click.ClickException, match="single-process"):  # broker still embedded
            check_shape(Settings(database_url="postgresql://h/db"), 8000, 30000, shape)
    shared = Settings(database_url="postgresql://h/db", broker_url="redis://h:6379/0")
    check_shape(shared, 8000, 30000, Shape(2, 3, 2))
    with pytest.raises(click.ClickException, match="overlap"):
        check_shape(shared, 30001, 30000, Shape(engines=2))
    assert "\n" not in SHARED_ERROR
    # the refusal comes before anything is started or written, as one line
    res = CliRunner().invoke(main, ["up", "--gateways", "2"])
    assert res.exit_code != 0 and "single-process" in res.output, res.output
    assert "--engines" in CliRunner().invoke(main, ["up", "--help"]).output

    assert split_cores(2, trainer=True, engines=2) == (1, 1)
    assert split_cores(8, trainer=True, engines=2) == (2, 4)
    assert split_cores(8, trainer=False, engines=3) == (2, 8)
    assert split_cores(1, trainer=True, engines=2) == (1, 1)


def test_up_engine_sglang_starts_the_operators_command_with_rlgates_flags(tmp_path):
    """`rlgate up --engine sglang`: RLGATE_SGLANG_COMMAND on the policy's HF directory,
    the LoRA flags and the engine key rlgate needs, then the operator's own flags (last,
    so they win); the embedded engine's own flags are not passed."""
    import shlex

    from core.settings import Settings
    from rlgate.up_sglang import sglang_command

    model = tmp_path / "hf-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    settings = Settings(
        data_dir=tmp_path,
        engine="sglang",
        model_path=str(model),
        sglang_command="env OMP_NUM_THREADS=1 /opt/sglang/bin/python -m sglang.launch_server",
        sglang_args="--device cpu --max-loras-per-batch 2",
    )
    cmd = sglang_command(settings, 31234, "-k3y")  # a random key may start with "-"
    assert cmd[:5] == shlex.split(settings.sglang_command)[:5]
    flags = " ".join(cmd)
    assert f"--model-path {model} --host 127.0.0.1 --port 31234 --api-key=-k3y" in flags
    assert "--enable-lora --max-lora-rank 64 --lora-target-modules all" in flags
    # the operator's flags, then (on CPU, none of theirs) the fraction computed for this start
    assert cmd[-6:-2] == ["--device", "cpu", "--max-loras-per-batch", "2"]
    assert cmd[-2] == "--mem-fraction-static" and 0.05 <= float(cmd[-1]) <= 0.9
    assert "--allowed-lora-dir" not in cmd and "--num-threads" not in cmd


def test_up_engine_flag_is_in_the_help():
    from click.testing import CliRunner

    from rlgate.cli import main

    out = CliRunner().invoke(main, ["up", "--help"]).output
    assert "--engine [embedded|sglang]" in out and "RLGATE_SGLANG_COMMAND" in out
