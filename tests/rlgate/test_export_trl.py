"""`rlgate export --as sft|preference|kto`: rows `datasets` and TRL's trainers read as they are.

The rows come from a real recorded SQLite database; the check runs in a separate venv with
TRL and `datasets` (scripts/trl_venv; TRL is no rlgate dependency), named by
RLGATE_TEST_TRL_PYTHON (scripts/test and .ci/run set it). It loads each file with
`datasets.load_dataset("json")` and trains one step of SFTTrainer, DPOTrainer and
KTOTrainer on the packaged model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.migrate import upgrade
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from schemas import generate
from schemas.atdp import RECORD_TYPES
from schemas.convert import to_row
from tests.servers import MODEL_CACHE

EXAMPLES = Path(generate.__file__).parent / "examples"
STEP_SCRIPT = Path(__file__).parents[1] / "trl_venv" / "load_and_step.py"


def _load(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def _record(sqlite_url: str) -> None:
    from core.db import make_engine, session_factory

    upgrade(sqlite_url)
    factory = session_factory(make_engine(sqlite_url))
    base = RECORD_TYPES["Interaction"].model_validate(_load("Interaction"))
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
    with factory() as db, db.begin():
        for name in ("Project", "Session"):
            db.merge(to_row(RECORD_TYPES[name].model_validate(_load(name))))
        db.flush()
        rows = []
        for i, (group, reward, text) in enumerate(
            [("g1", 1.0, "19"), ("g1", -1.0, "18"), ("g2", 1.0, "4"), ("g2", 0.0, "5")]
        ):
            rows.append(
                base.model_copy(
                    update={
                        "id": f"chatcmpl-{i}",
                        "seq": i,
                        "group_id": group,
                        "choice_index": i % 2,
                        "reward": reward,
                        "output": base.output.model_copy(update={"text": text}),
                    }
                )
            )
        called = base.model_copy(
            update={
                "id": "chatcmpl-tool",
                "seq": 9,
                "group_id": None,
                "reward": None,
                "policy_version": "policy-v4",
                "finish_reason": "tool_calls",
                "request": {**base.request, "tools": [tool]},
                "output": type(base.output).model_validate(
                    {
                        "text": "",
                        "tool_calls": [
                            {"id": "call_1", "name": "add", "arguments": '{"a":7,"b":12}'}
                        ],
                    }
                ),
            }
        )
        # one question asked in two sessions, no group: rated apart, they still pair up
        asked = {**base.request, "messages": [{"role": "user", "content": "Name a red fruit."}]}
        apart = [
            base.model_copy(
                update={
                    "id": f"chatcmpl-apart-{i}",
                    "seq": 20 + i,
                    "group_id": None,
                    "reward": reward,
                    "request": asked,
                    "output": base.output.model_copy(update={"text": text}),
                }
            )
            for i, (reward, text) in enumerate([(-1.0, "Banana."), (1.0, "A strawberry.")])
        ]
        for rec in [*rows, called, *apart]:
            db.add(to_row(rec))


def _export(tmp_path: Path, *args: str) -> tuple[Path, list[dict]]:
    out = tmp_path / f"{'_'.join(a.strip('-') for a in args)}.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "rlgate.cli", "export", "-o", str(out), *args],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return out, [json.loads(line) for line in out.read_text().splitlines()]


def test_trl_rows_and_filters(sqlite_url, tmp_path, monkeypatch):
    _record(sqlite_url)
    monkeypatch.setenv("RLGATE_DATABASE_URL", sqlite_url)
    _, sft = _export(tmp_path, "--as", "sft")
    assert len(sft) == 7
    tool_row = [r for r in sft if "tools" in r]
    assert len(tool_row) == 1
    answer = tool_row[0]["messages"][-1]
    assert answer["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 7, "b": 12}}
    assert tool_row[0]["tools"][0]["function"]["name"] == "add"
    _, pref = _export(tmp_path, "--as", "preference")
    assert sorted((p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pref) == [
        ("19", "18"),
        ("4", "5"),
        ("A strawberry.", "Banana."),  # two sessions, the same question
    ]
    _, kto = _export(tmp_path, "--as", "kto")
    assert [(k["completion"][0]["content"], k["label"]) for k in kto] == [
        ("19", True),
        ("18", False),
        ("4", True),
        ("5", False),
        ("Banana.", False),
        ("A strawberry.", True),
    ]
    _, kto_min = _export(tmp_path, "--as", "kto", "--min-reward", "0.5")
    assert [k["label"] for k in kto_min] == [True, True, True]
    _, v4 = _export(tmp_path, "--as", "sft", "--policy-version", "policy-v4")
    assert len(v4) == 1 and "tools" in v4[0]
    _, none = _export(tmp_path, "--as", "sft", "--until", "2000-01-01")
    assert none == []
    r = subprocess.run(
        [sys.executable, "-m", "rlgate.cli", "export", "--as", "sft", "--type", "session"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "--as sft exports interactions" in r.stderr


def test_datasets_and_trl_load_the_exports(sqlite_url, tmp_path, monkeypatch):
    trl_python = os.environ.get("RLGATE_TEST_TRL_PYTHON")
    if not trl_python:
        if os.environ.get("CI"):
            pytest.fail("RLGATE_TEST_TRL_PYTHON is unset in CI (.ci/run builds scripts/trl_venv)")
        pytest.skip("needs RLGATE_TEST_TRL_PYTHON=$(bash scripts/trl_venv)")
    _record(sqlite_url)
    monkeypatch.setenv("RLGATE_DATABASE_URL", sqlite_url)
    paths = [_export(tmp_path, "--as", shape)[0] for shape in ("sft", "preference", "kto")]
    model = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_DISABLED": "1"}
    r = subprocess.run(
        [trl_python, str(STEP_SCRIPT), str(model), *map(str, paths), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["sft"]["rows"] == 7 and "messages" in report["sft"]["columns"]
    assert report["preference"] == {**report["preference"], "rows": 3}
    assert report["preference"]["columns"] == ["chosen", "prompt", "rejected"]
    assert report["kto"]["columns"] == ["completion", "label", "prompt"]
    for shape in ("sft", "preference", "kto"):
        assert isinstance(report[shape]["loss"], float), report
