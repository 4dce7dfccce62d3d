"""examples/swe: every shipped repository fails its tests as shipped and passes with the
reference fix; rlgate's command verifier, configured the way run.py configures it, rates a
session +1 or -1 from the agent's workspace. CPU only, no network, no agent."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import select

from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import FeedbackRow, InteractionRow
from tests.rows import interaction, session

SWE = Path(__file__).resolve().parents[2] / "examples" / "swe"


def _load(name: str) -> ModuleType:
    """A module of examples/swe (run.py and verify.py import swe_tasks from there)."""
    if str(SWE) not in sys.path:
        sys.path.insert(0, str(SWE))
    full = f"swe_example_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, SWE / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[full]


swe_tasks = _load("swe_tasks")
TASK_NAMES = [t.name for t in swe_tasks.TASKS]


@pytest.mark.parametrize("name", TASK_NAMES)
def test_repo_fails_as_shipped_and_passes_with_the_reference_fix(name, tmp_path):
    task = swe_tasks.get_task(name)
    repo = swe_tasks.copy_repo(task, tmp_path / "repo")
    passed, output = swe_tasks.run_tests(task, repo)
    assert not passed, output
    assert "FAILED" in output
    swe_tasks.apply_fix(task, repo)
    passed, output = swe_tasks.run_tests(task, repo)
    assert passed, output
    assert task.name in task.repo.name and task.prompt().startswith(task.issue)


def test_editing_the_tests_does_not_pass(tmp_path):
    task = swe_tasks.get_task("mean")
    repo = swe_tasks.copy_repo(task, tmp_path / "repo")
    (repo / "test_stats.py").write_text("import unittest\n")  # no tests: would "pass"
    passed, _ = swe_tasks.run_tests(task, repo)
    assert not passed
    assert "def test_mean" in (repo / "test_stats.py").read_text()


def test_verify_script_exit_status(tmp_path):
    task = swe_tasks.get_task("clamp")
    repo = swe_tasks.copy_repo(task, tmp_path / "repo")

    def verify(*args: str) -> int:
        cmd = [sys.executable, str(SWE / "verify.py"), *args]
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode

    assert verify("--task", "clamp", "--repo", str(repo)) == 1
    swe_tasks.apply_fix(task, repo)
    assert verify("--task", "clamp", "--repo", str(repo)) == 0
    assert verify("--task", "no-such-task", "--repo", str(repo)) == 2
    assert verify("--task", "clamp") == 2  # no workspace named


def test_project_command_verifier_rates_the_workspace(tmp_path, monkeypatch):
    """run.py's project settings and the operator's entry it prints + rlgate's verifier
    code (what the verify task runs)."""
    from core.db import make_engine, session_factory
    from core.migrate import upgrade
    from core.settings import get_settings
    from trainer.hooks import run_verifiers

    url = get_settings().effective_database_url  # SQLite under the test's data dir
    upgrade(url)
    run = _load("run")
    workspaces = tmp_path / "workspaces"
    assert run.main(["--workspaces", str(workspaces)]) == 2  # not granted: says how, exits
    monkeypatch.setenv("RLGATE_COMMANDS", run.operator_config(workspaces, "swe"))
    get_settings.cache_clear()
    agent_key, admin_key = run.configure_project("swe", workspaces, True, True)
    assert agent_key and agent_key.startswith("rlg_") and admin_key

    factory = session_factory(make_engine(url))
    fixed, broken = "sess_fixed", "sess_broken"
    with factory() as db, db.begin():
        for sid in (fixed, broken):
            db.add(to_row(session(sid, "swe", task_id="slugify", status="closed", at=utcnow())))
        db.flush()
        for sid in (fixed, broken):
            for seq in (0, 1):
                answer = interaction(
                    f"{sid}-{seq}",
                    sid,
                    seq,
                    "done",
                    project_id="swe",
                    question="fix it",
                    start=utcnow(),
                )
                db.add(to_row(answer))
    task = swe_tasks.get_task("slugify")
    for sid in (fixed, broken):
        swe_tasks.copy_repo(task, workspaces / sid / "repo")
    swe_tasks.apply_fix(task, workspaces / fixed / "repo")

    for sid, want in ((fixed, 1.0), (broken, -1.0)):
        stored = run_verifiers(factory, sid)
        assert [f["reward"] for f in stored] == [want]
        verdict = (workspaces / sid / "verify.log").read_text().split()[0]
        assert verdict == ("PASS" if want > 0 else "FAIL")
    with factory() as db:
        fb = db.scalars(select(FeedbackRow).where(FeedbackRow.source == "verifier")).all()
        rewards = dict(db.execute(select(InteractionRow.id, InteractionRow.reward)).all())
    assert {(f.target_id, f.rater) for f in fb} == {(fixed, "command"), (broken, "command")}
    # session feedback flows back over both turns (gamma 1)
    assert rewards == {
        f"{fixed}-0": 1.0,
        f"{fixed}-1": 1.0,
        f"{broken}-0": -1.0,
        f"{broken}-1": -1.0,
    }
