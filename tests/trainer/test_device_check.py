"""scripts/device_check.py in its CPU mode (CPU bfloat16 vs CPU float32) on the tiny
random-weight model: the trainer and engine checks pass, and a target that computes
something else (other LoRA weights) is caught as FAIL with a non-zero exit. The GPU path
itself needs a GPU and does not run here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.py"


@pytest.fixture(scope="module")
def device_check():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_check"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("device_check", None)


def test_cpu_mode_passes(device_check, tmp_path, capsys):
    out = tmp_path / "result.json"
    argv = ["--cpu-only", "--tiny", "--only", "trainer,engine", "--json", str(out)]
    assert device_check.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    checks = {r["check"]: r for r in rows if "ok" in r}
    assert len(checks) == 8
    assert all(r["ok"] for r in checks.values())
    assert checks["trainer LoRA update cosine"]["value"] >= 0.95
    text = capsys.readouterr().out
    assert text.count("PASS ") == 8 and "FAIL" not in text
    assert "SUMMARY: 8/8 checks passed on cpu torch.bfloat16" in text


def test_a_different_target_fails(device_check, tmp_path, capsys, monkeypatch):
    original = device_check.randomize_lora

    def mismatched(policies, seed):  # the target gets other LoRA weights than the reference
        original(policies[:1], seed)
        original(policies[1:], seed + 99)

    monkeypatch.setattr(device_check, "randomize_lora", mismatched)
    assert device_check.main(["--cpu-only", "--tiny", "--only", "trainer"]) == 1
    text = capsys.readouterr().out
    assert "FAIL trainer LoRA gradient rel L2" in text
    assert "FAIL trainer logprobs max |diff| (adapter on)" in text
    assert "PASS trainer logprobs max |diff| (adapter off)" in text  # the base is the same
