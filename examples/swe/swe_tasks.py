"""The SWE tasks of the example: tiny repositories under ``repos/``, each with a bug and a
unittest suite that fails until the bug is fixed.

Used by ``run.py`` (copy a repo into a fresh workspace), ``verify.py`` (the command that
rlgate's ``command`` verifier runs) and ``tests/examples/``. Standard library only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOS = HERE / "repos"
TEST_COMMAND = ("-m", "unittest")  # run with a Python interpreter, in the repo's root
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class Fix:
    """The reference fix: replace ``old`` by ``new`` (once) in ``path``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Task:
    name: str  # also the directory under repos/ and the session's task_id
    issue: str  # what the agent is told
    fix: Fix

    @property
    def repo(self) -> Path:
        return REPOS / self.name

    def prompt(self) -> str:
        return (
            f"{self.issue}\n\nThe repository is the current directory. "
            "Run the tests with `python3 -m unittest`; they must pass. "
            "Fix the code, not the tests."
        )


TASKS: tuple[Task, ...] = (
    Task(
        "mean",
        "`stats.mean([1, 2, 3])` returns 3.0 instead of 2.0.",
        Fix("stats.py", "/ (len(values) - 1)", "/ len(values)"),
    ),
    Task(
        "wordcount",
        '`words.count_words("  hello   world\\n")` returns 6 instead of 2, and '
        '`count_words("")` returns 1 instead of 0.',
        Fix("words.py", 'text.split(" ")', "text.split()"),
    ),
    Task(
        "clamp",
        "`bounds.clamp(5, 0, 10)` returns 0 instead of 5.",
        Fix("bounds.py", "min(x, lo)", "min(x, hi)"),
    ),
    Task(
        "slugify",
        '`slug.slugify("Hello, World!")` returns "Hello-World" instead of "hello-world".',
        Fix("slug.py", 'return "-".join(words)', 'return "-".join(words).lower()'),
    ),
)


def get_task(name: str) -> Task:
    for task in TASKS:
        if task.name == name:
            return task
    raise KeyError(f"no task {name!r}; tasks: {', '.join(t.name for t in TASKS)}")


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(".pyc")}


def copy_repo(task: Task, dest: Path) -> Path:
    """A fresh copy of the task's repository at ``dest`` (which must not exist)."""
    shutil.copytree(task.repo, dest, ignore=_ignore)
    return dest


def apply_fix(task: Task, repo: Path) -> None:
    """Apply the reference fix to a copy of the repository."""
    path = repo / task.fix.path
    text = path.read_text()
    if task.fix.old not in text:
        raise ValueError(f"{task.name}: {task.fix.old!r} not found in {task.fix.path}")
    path.write_text(text.replace(task.fix.old, task.fix.new, 1))


def restore_tests(task: Task, repo: Path) -> list[str]:
    """Put the shipped test files back (an agent must not pass by editing the tests)."""
    restored = []
    for src in sorted(task.repo.glob("test_*.py")):
        shutil.copyfile(src, repo / src.name)
        restored.append(src.name)
    return restored


def run_tests(
    task: Task, repo: Path, timeout_s: float = 60.0, python: str | None = None
) -> tuple[bool, str]:
    """Restore the shipped tests, run them in ``repo``; (passed, combined output)."""
    restore_tests(task, repo)
    try:
        proc = subprocess.run(
            [python or sys.executable, *TEST_COMMAND],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False, f"tests timed out after {timeout_s:.0f} s"
    return proc.returncode == 0, proc.stdout + proc.stderr
