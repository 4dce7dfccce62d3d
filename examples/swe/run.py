"""SWE example: an agent fixes small buggy repositories through the rlgate gateway; the
repositories' tests are the reward; rlgate trains on the rated trajectories and exports them.

For each task (``swe_tasks.TASKS``):

1. open a session on the gateway (``POST /v1/sessions``: a per-session agent key, task_id =
   the task's name) and copy the task's repository into ``<workspaces>/<session id>/repo``;
2. run the agent there with the per-session key, so each of its model calls is recorded in
   that session: mini-swe-agent (litellm, OpenAI Chat Completions with a ``bash`` tool) or
   Claude Code (``claude -p``, Anthropic Messages);
3. end the session. With ``--verify worker`` (default) the project's ``command`` verifier
   (rlgate's ``trainer/verifiers.py``) runs the operator's command entry ``swe_verify``
   (``verify.py``; ``--operator-config`` prints it for the worker's and gateway's
   configuration) in the worker's verify pool: the tests pass -> reward +1, else -1, stored as
   session feedback that flows back over the turns. With ``--verify local`` this script runs
   the tests itself and posts the result with ``POST /feedback`` (as a user rating).

Then it trains (``POST /admin/api/actions/train-now``: the worker runs the same job as the
schedule; or ``rlgate train --once``), and exports the rated trajectories as ATDP JSONL
(``rlgate export --rated-only``).

Run it with the project's Python, in the same environment as ``rlgate up`` (the same
``RLGATE_DATA_DIR`` / ``RLGATE_DATABASE_URL``): it writes the project's verifier settings
(which name the operator's entry) and creates its keys in that database. See README.md.
The agents are in ``swe_agents.py``, the calls to the gateway in ``swe_gateway.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(REPO_ROOT))

from swe_agents import AGENTS, AgentResult  # noqa: E402
from swe_gateway import Gateway  # noqa: E402
from swe_tasks import TASKS, Task, copy_repo, get_task, run_tests  # noqa: E402

DEFAULT_MINI = "/tmp/swevenv/bin/mini"
TERMINAL_RUN = {"published", "trained-not-published", "failed", "cancelled", "skipped", "rejected"}


def log(msg: str) -> None:
    print(f"[swe {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class TaskResult:
    task: str
    session_id: str
    agent: AgentResult
    interactions: int
    passed: bool | None
    reward: float | None


# ---- the project: keys and the command verifier (written to rlgate's database) ---------------


COMMAND_ENTRY = "swe_verify"  # the operator's [commands.swe_verify]


def command_entry(workspaces: Path, project: str) -> dict[str, Any]:
    """The operator's command entry (core/grants.py): verify.py on
    ``<workspaces>/<session id>/repo`` (the session's task_id names the task), for
    ``project`` only. A project admin cannot set this; the operator's configuration does."""
    return {
        "command": [sys.executable, str(HERE / "verify.py")],
        "timeout_s": 120,
        "env": {"SWE_WORKSPACES": str(workspaces)},
        "projects": [project],
    }


def operator_config(workspaces: Path, project: str) -> str:
    """The value of the operator's RLGATE_COMMANDS holding the entry (or put it in the TOML
    file of RLGATE_CONFIG as ``[commands.swe_verify]``), for the gateway and the worker."""
    return json.dumps({COMMAND_ENTRY: command_entry(workspaces, project)})


def verifier_spec() -> dict[str, Any]:
    """The project's verifier: the ``command`` verifier running the operator's entry."""
    return {"name": "command", "use": COMMAND_ENTRY}


def configure_project(
    project: str, workspaces: Path, want_keys: bool, verify_worker: bool
) -> tuple[str | None, str | None]:
    """Create the project (and an agent + admin key when ``want_keys``) and, for
    ``verify_worker``, set its ``command`` verifier to the operator's entry. Uses rlgate's settings
    (RLGATE_DATA_DIR / RLGATE_DATABASE_URL), like ``rlgate keys create``."""
    from core.db import make_engine, session_factory, transaction
    from core.keys import create_key, ensure_project
    from core.settings import get_settings

    factory = session_factory(make_engine(get_settings().effective_database_url))
    agent_key = admin_key = None
    with transaction(factory) as db:
        row = ensure_project(db, project)
        if verify_worker:
            row.settings = {**(row.settings or {}), "verifiers": [verifier_spec()]}
        if want_keys:
            _, agent_key = create_key(db, project, "agent", name="examples/swe agent")
            _, admin_key = create_key(db, project, "admin", name="examples/swe admin")
    return agent_key, admin_key


def _entry_granted(project: str) -> bool:
    from core.settings import get_settings

    entry = get_settings().commands.get(COMMAND_ENTRY)
    return entry is not None and entry.allows(project)


# ---- one task -----------------------------------------------------------------------------


def wait_for(fn: Any, timeout: float, every: float = 1.0) -> Any:
    """Call ``fn`` until it returns something true or ``timeout`` passes; a slow or failed
    HTTP call (a busy CPU machine) counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
        except (httpx.HTTPError, RuntimeError) as e:
            log(f"  (retrying: {type(e).__name__}: {str(e)[:120]})")
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def settle(gw: Gateway, session_id: str, at_least: int, timeout: float = 10.0) -> int:
    """The session's interaction count once its rows are in the database (the gateway
    writes them a few milliseconds after answering): at least ``at_least`` and unchanged
    for a second, or whatever is there after ``timeout``."""
    seen = [-1]

    def stable() -> bool:
        n = gw.interactions(session_id)
        done = n >= at_least and n == seen[0]
        seen[0] = n
        return done

    wait_for(stable, timeout, every=1.0)
    return gw.interactions(session_id)


def do_task(args: argparse.Namespace, gw: Gateway, task: Task) -> TaskResult:
    sid, session_key = gw.open_session(task, args.agent)
    ws = args.workspaces / sid
    ws.mkdir(parents=True)
    repo = copy_repo(task, ws / "repo")
    log(f"{task.name}: session {sid}, workspace {repo}")
    agent = AGENTS[args.agent](args, task, repo, ws, gw.base, session_key)
    calls = "" if agent.calls is None else f", {agent.calls} model calls"
    log(f"{task.name}: agent done: {agent.exit_status}{calls}, {agent.seconds:.0f} s")
    log(f"{task.name}: agent log {agent.log_path}")
    n = settle(gw, sid, agent.calls or 1)
    gw.end_session(sid, session_key)
    passed: bool | None = None
    reward: float | None = None
    if n == 0:
        log(f"{task.name}: no model call was recorded: nothing to rate")
    elif args.verify == "worker":
        fb = wait_for(lambda: gw.verifier_feedback(sid), args.verify_timeout, every=2)
        if fb:
            reward = float(fb[-1]["reward"])
            passed = reward > 0
        else:
            log(f"{task.name}: no verifier feedback after {args.verify_timeout} s (worker busy?)")
    else:
        passed, _ = run_tests(task, repo)
        reward = float(gw.rate(sid, passed)["reward"])
    verdict = {True: "PASS", False: "FAIL", None: "-"}[passed]
    log(f"{task.name}: {n} interactions, tests {verdict}, reward {reward}")
    return TaskResult(task.name, sid, agent, n, passed, reward)


# ---- training and export ------------------------------------------------------------------


def train(args: argparse.Namespace, gw: Gateway) -> dict[str, Any] | None:
    if args.train == "none":
        return None
    if args.train == "cli":
        cmd = [sys.executable, "-m", "rlgate.cli", "train", "--once", "-p", args.project]
        log("training: " + " ".join(cmd[1:]))
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            log(f"training failed: {proc.stderr[-800:]}")
            return None
        run_id = json.loads(lines[-1]).get("run_id")
        return gw.run(run_id) if run_id else json.loads(lines[-1])
    run_id = gw.action("train-now", args.project)["run_id"]
    log(f"training: run {run_id} queued (POST /admin/api/actions/train-now); waiting")
    shown = [""]

    def finished() -> dict[str, Any] | None:
        run = gw.run(run_id)
        if run["status"] != shown[0]:
            log(f"training: run {run_id} {run['status']}")
            shown[0] = run["status"]
        return run if run["status"] in TERMINAL_RUN else None

    run = wait_for(finished, args.train_timeout, every=5)
    if run is None:
        log(f"training: run {run_id} not finished after {args.train_timeout:.0f} s")
        run = wait_for(lambda: gw.run(run_id), 60)
    return run


def export(args: argparse.Namespace, since: str) -> tuple[Path, int]:
    """``rlgate export``: this run's rated interactions (ATDP v1 JSONL)."""
    out: Path = args.export
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "rlgate.cli", "export", "--format", "jsonl"]
    cmd += ["--project", args.project, "--rated-only", "--since", since, "-o", str(out)]
    log("export: rlgate " + " ".join(cmd[3:]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"rlgate export failed: {proc.stderr[-800:]}")
    return out, sum(1 for line in out.read_text().splitlines() if line.strip())


# ---- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="An agent fixes small repos through rlgate; tests are the reward.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="the gateway")
    ap.add_argument("--project", default="swe", help="rlgate project of the sessions")
    ap.add_argument("--agent-key", default=None, help="default: create one (needs the database)")
    ap.add_argument("--admin-key", default=None, help="default: create one (needs the database)")
    ap.add_argument("--tasks", default="all", help="comma-separated task names, or all")
    ap.add_argument("--attempts", type=int, default=1, help="sessions per task")
    ap.add_argument(
        "--agent",
        choices=sorted(AGENTS),
        default="mini",
        help="reference: no agent, one model call + the reference fix (checks the +1 path)",
    )
    ap.add_argument(
        "--mini",
        default=os.environ.get("SWE_MINI", DEFAULT_MINI),
        help="mini-swe-agent's `mini` executable",
    )
    ap.add_argument(
        "--mini-config",
        default=str(HERE / "mini_swe.yaml"),
        help="mini-swe-agent config (mini.yaml: mini-swe-agent's own prompts)",
    )
    ap.add_argument("--claude", default="claude", help="Claude Code's executable")
    ap.add_argument("--claude-tools", default="Bash", help="Claude Code --tools")
    ap.add_argument("--model", default="openai/rlgate-policy", help="litellm model name")
    ap.add_argument("--steps", type=int, default=4, help="model calls per task at most")
    ap.add_argument("--max-tokens", type=int, default=160, help="per model call")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--agent-timeout", type=int, default=300, help="seconds per task")
    ap.add_argument(
        "--verify",
        choices=["worker", "local"],
        default="worker",
        help="worker: rlgate's command verifier; local: run the tests here + POST /feedback",
    )
    ap.add_argument("--verify-timeout", type=float, default=300)
    ap.add_argument(
        "--operator-config",
        action="store_true",
        help="print the operator's command entry for --verify worker and exit",
    )
    ap.add_argument(
        "--train",
        choices=["api", "cli", "none"],
        default="api",
        help="api: train-now, run by the worker; cli: rlgate train --once, run here",
    )
    ap.add_argument("--train-timeout", type=float, default=1200)
    ap.add_argument(
        "--no-pause",
        action="store_true",
        help="do not pause scheduled training while the tasks run",
    )
    ap.add_argument("--workspaces", type=Path, default=Path("/tmp/rlgate-swe/workspaces"))
    ap.add_argument("--export", type=Path, default=Path("/tmp/rlgate-swe/swe-trajectories.jsonl"))
    ap.add_argument("--no-export", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.workspaces = args.workspaces.resolve()
    if args.operator_config:
        print(operator_config(args.workspaces, args.project))
        return 0
    if args.verify == "worker" and not _entry_granted(args.project):
        log(
            f"--verify worker runs the operator's command entry {COMMAND_ENTRY!r}, which this "
            f"environment's rlgate settings do not grant to project {args.project!r}. Give the "
            "gateway and the worker (and this script) this setting, then restart them:\n"
            f"  RLGATE_COMMANDS='{operator_config(args.workspaces, args.project)}'\n"
            "or use --verify local"
        )
        return 2
    tasks = list(TASKS) if args.tasks == "all" else [get_task(t) for t in args.tasks.split(",")]
    if args.agent == "mini" and not shutil.which(args.mini):
        log(f"mini-swe-agent not found at {args.mini}: pip install mini-swe-agent (see README)")
        return 2
    if args.agent == "claude" and not shutil.which(args.claude):
        log("Claude Code not found: npm install -g @anthropic-ai/claude-code")
        return 2

    need_keys = not (args.agent_key and args.admin_key)
    if need_keys or args.verify == "worker":
        agent_key, admin_key = configure_project(
            args.project, args.workspaces, need_keys, args.verify == "worker"
        )
        args.agent_key = args.agent_key or agent_key
        args.admin_key = args.admin_key or admin_key
        if need_keys:
            log(f"project {args.project}: admin key (dashboard login): {args.admin_key}")
        if args.verify == "worker":
            log(f"project {args.project}: command verifier -> {COMMAND_ENTRY} (verify.py)")
    gw = Gateway(args.base_url, args.agent_key, args.admin_key)
    gw.health()
    args.workspaces.mkdir(parents=True, exist_ok=True)

    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))  # UTC
    paused_here = False
    if not args.no_pause and not gw.project(args.project)["training_paused"]:
        gw.action("pause", args.project)  # no scheduled run while the tasks run
        paused_here = True
    results: list[TaskResult] = []
    try:
        for task in tasks:
            for _ in range(args.attempts):
                results.append(do_task(args, gw, task))
    finally:
        if paused_here:
            gw.action("resume", args.project)
    run = train(args, gw)
    exported = None if args.no_export else export(args, started)

    print("\n== summary ==")
    for r in results:
        verdict = {True: "PASS", False: "FAIL", None: "-"}[r.passed]
        print(
            f"{r.task:<10} {r.session_id}  agent {r.agent.exit_status:<18} "
            f"calls {r.interactions:<2} tests {verdict:<4} reward {r.reward}"
        )
    rewards = [r.reward for r in results if r.reward is not None]
    solved = sum(1 for r in results if r.passed)
    print(f"tasks {len(results)}, solved {solved}, rated {len(rewards)}")
    if run:
        pv = (run.get("policy_version") or {}).get("name")
        print(
            f"training run {run.get('id')}: {run.get('status')}, samples {run.get('num_samples')}, "
            f"steps {run.get('steps')}, adapter {pv}, error {run.get('error')}"
        )
    if exported:
        print(f"export: {exported[1]} rated ATDP interaction records -> {exported[0]}")
    print(f"dashboard: {gw.base}/admin/sessions?project={args.project}")
    if run and run.get("id"):
        print(f"           {gw.base}/admin/runs/{run['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
