"""Run a task's tests in an agent's workspace; exit 0 when they pass, 1 when they fail.

This is the command that rlgate's ``command`` verifier runs when a session closes
(``run.py`` writes it into the project's settings). The verifier passes the session in the
environment: ``RLGATE_TASK_ID`` names the task, ``RLGATE_SESSION_ID`` the workspace
``$SWE_WORKSPACES/<session id>/repo``. The shipped test files are copied back first, so
editing the tests does not earn a reward. The test output goes to
``$SWE_WORKSPACES/<session id>/verify.log`` (the verifier itself discards output).

By hand: ``python examples/swe/verify.py --task mean --repo /path/to/copy``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from swe_tasks import SAFE_NAME, get_task, run_tests  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default=os.environ.get("RLGATE_TASK_ID", ""))
    ap.add_argument("--repo", type=Path, default=None, help="default: from the environment")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)

    log_path: Path | None = None
    repo: Path | None = args.repo
    if repo is None:
        root, sid = os.environ.get("SWE_WORKSPACES", ""), os.environ.get("RLGATE_SESSION_ID", "")
        if not root or not SAFE_NAME.match(sid):
            print("verify: need --repo, or SWE_WORKSPACES and RLGATE_SESSION_ID", file=sys.stderr)
            return 2
        repo = Path(root) / sid / "repo"
        log_path = Path(root) / sid / "verify.log"
    try:
        task = get_task(args.task)
    except KeyError as e:
        print(f"verify: {e}", file=sys.stderr)
        return 2
    if not repo.is_dir():
        print(f"verify: no workspace at {repo}", file=sys.stderr)
        return 2
    passed, output = run_tests(task, repo, args.timeout)
    verdict = "PASS" if passed else "FAIL"
    if log_path is not None:
        log_path.write_text(f"{verdict} {task.name}\n{output}")
    print(f"{verdict} {task.name}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
