"""SWE example: an agent fixes small buggy repositories through the rlgate gateway; the
repositories' tests are the reward; rlgate trains on the rated trajectories and exports them.

For each task (``swe_tasks.TASKS``):

1. open a session on the gateway (``POST /v1/sessions``: a per-session agent key, task_id =
   the task's name) and copy the task's repository into ``<workspaces>/<session id>/repo``;
2. run the agent there with the per-session key, so each of its model calls is recorded in
   that session: mini-swe-agent (litellm, OpenAI Chat Completions with a ``bash`` tool) or
   Claude Code (``claude -p``, Anthropic Messages);
3. end the session. With ``--verify worker`` (default) the project's ``command`` verifier
   (rlgate's ``trainer/verifiers.py``, configured here in the project's settings) runs
   ``verify.py`` in the Celery worker: the tests pass -> reward +1, else -1, stored as
   session feedback that flows back over the turns. With ``--verify local`` this script runs
   the tests itself and posts the same rating with ``POST /feedback``.

Then it trains (``POST /admin/api/actions/train-now``: the worker runs the same job as the
schedule; or ``rlgate train --once``), and exports the rated trajectories as ATDP JSONL
(``rlgate export --rated-only``).

Run it with the project's Python, in the same environment as ``rlgate up`` (the same
``RLGATE_DATA_DIR`` / ``RLGATE_DATABASE_URL``): it writes the project's verifier settings and
creates its keys in that database. See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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

from swe_tasks import TASKS, Task, apply_fix, copy_repo, get_task, run_tests  # noqa: E402

DEFAULT_MINI = "/tmp/swevenv/bin/mini"
TERMINAL_RUN = {"published", "trained-not-published", "failed", "cancelled", "skipped", "rejected"}
CLAUDE_SYSTEM = (
    "You fix bugs in small Python repositories. Use the Bash tool to read files, edit them "
    "and run the tests. Keep answers short."
)


def log(msg: str) -> None:
    print(f"[swe {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class AgentResult:
    exit_status: str
    calls: int | None
    seconds: float
    log_path: Path


@dataclass
class TaskResult:
    task: str
    session_id: str
    agent: AgentResult
    interactions: int
    passed: bool | None
    reward: float | None


# ---- the gateway ------------------------------------------------------------------------


class Gateway:
    def __init__(self, base_url: str, agent_key: str, admin_key: str) -> None:
        self.base = base_url.rstrip("/")
        self.agent_key = agent_key
        self.admin_key = admin_key
        self.http = httpx.Client(base_url=self.base, timeout=60)

    def _call(self, method: str, path: str, key: str, **kw: Any) -> Any:
        r = self.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def health(self) -> None:
        r = self.http.get("/health")
        if r.status_code != 200:
            raise RuntimeError(f"{self.base}/health: {r.status_code} {r.text[:200]}")

    def open_session(self, task: Task, agent: str) -> tuple[str, str]:
        body = {
            "task_id": task.name,  # the verifier's RLGATE_TASK_ID, the trainer's baseline key
            "agent_name": AGENT_NAMES[agent],
            "metadata": {"example": "swe"},
        }
        out = self._call("POST", "/v1/sessions", self.agent_key, json=body)
        return out["id"], out["api_key"]

    def end_session(self, session_id: str, session_key: str) -> None:
        self._call("POST", f"/v1/sessions/{session_id}/end", session_key)

    def interactions(self, session_id: str) -> int:
        out = self._call("GET", f"/v1/sessions/{session_id}", self.admin_key)
        return len(out.get("interactions") or [])

    def verifier_feedback(self, session_id: str) -> list[dict[str, Any]]:
        params = {"session_id": session_id, "source": "verifier"}
        return self._call("GET", "/v1/feedback", self.admin_key, params=params)["data"]

    def rate(self, session_id: str, passed: bool) -> dict[str, Any]:
        body = {
            "session_id": session_id,
            "value": 1 if passed else -1,
            "scale": "scalar",
            "min": -1,
            "max": 1,
            "source": "verifier",
            "rater": "swe-tests",
            "idempotency_key": f"swe-tests:{session_id}",
        }
        return self._call("POST", "/feedback", self.agent_key, json=body)

    def project(self, project_id: str) -> dict[str, Any]:
        for p in self._call("GET", "/admin/api/overview", self.admin_key)["projects"]:
            if p["id"] == project_id:
                return p
        raise RuntimeError(f"project {project_id} is not visible to the admin key")

    def action(self, action: str, project_id: str) -> dict[str, Any]:
        body = {"project_id": project_id}
        return self._call("POST", f"/admin/api/actions/{action}", self.admin_key, json=body)

    def run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/admin/api/runs/{run_id}", self.admin_key)


# ---- the project: keys and the command verifier (written to rlgate's database) ---------------


def verifier_spec(workspaces: Path) -> dict[str, Any]:
    """rlgate's ``command`` verifier running verify.py on ``<workspaces>/<session id>/repo``
    (the session's task_id names the task)."""
    return {
        "name": "command",
        "command": [sys.executable, str(HERE / "verify.py")],
        "timeout_s": 120,
        "env": {"SWE_WORKSPACES": str(workspaces)},
    }


def configure_project(
    project: str, workspaces: Path, want_keys: bool, verify_worker: bool
) -> tuple[str | None, str | None]:
    """Create the project (and an agent + admin key when ``want_keys``) and, for
    ``verify_worker``, set its ``command`` verifier to run verify.py. Uses rlgate's settings
    (RLGATE_DATA_DIR / RLGATE_DATABASE_URL), like ``rlgate keys create``."""
    from core.db import make_engine, session_factory, transaction
    from core.keys import create_key, ensure_project
    from core.settings import get_settings

    factory = session_factory(make_engine(get_settings().effective_database_url))
    agent_key = admin_key = None
    with transaction(factory) as db:
        row = ensure_project(db, project)
        if verify_worker:
            row.settings = {**(row.settings or {}), "verifiers": [verifier_spec(workspaces)]}
        if want_keys:
            _, agent_key = create_key(db, project, "agent", name="examples/swe agent")
            _, admin_key = create_key(db, project, "admin", name="examples/swe admin")
    return agent_key, admin_key


# ---- agents -------------------------------------------------------------------------------


def agent_env(extra: dict[str, str]) -> dict[str, str]:
    """The agent's environment: ours without rlgate's settings (no admin key, no database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGATE_")}
    env.update(extra)
    return env


def run_mini(
    args: argparse.Namespace, task: Task, repo: Path, out: Path, base: str, key: str
) -> AgentResult:
    traj = out / "mini.traj.json"
    cmd = [
        args.mini,
        "--agent-class", "default",  # not the interactive agent: never prompts
        "-m", args.model,
        "-t", task.prompt(),
        "-c", args.mini_config,
        "-c", f"agent.step_limit={args.steps}",
        "-c", "agent.cost_limit=0",
        "-c", f"agent.wall_time_limit_seconds={args.agent_timeout}",
        "-c", f"environment.cwd={repo}",
        "-c", "environment.timeout=30",
        "-c", f"model.model_kwargs.api_base={base}/v1",
        "-c", f"model.model_kwargs.max_tokens={args.max_tokens}",
        "-c", f"model.model_kwargs.temperature={args.temperature}",
        "-o", str(traj),
    ]  # fmt: skip
    env = agent_env(
        {
            "OPENAI_API_KEY": key,  # the per-session key: every call lands in this session
            "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
            "MSWEA_GLOBAL_CONFIG_DIR": str(out / "mini-config"),
            "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download at import
            "PAGER": "cat",
        }
    )
    result = _run_agent(cmd, env, out / "agent.log", args.agent_timeout + 120)
    if traj.is_file():
        info = json.loads(traj.read_text()).get("info", {})
        result.exit_status = info.get("exit_status") or result.exit_status
        result.calls = info.get("model_stats", {}).get("api_calls")
    return result


def run_claude(
    args: argparse.Namespace, task: Task, repo: Path, out: Path, base: str, key: str
) -> AgentResult:
    cmd = [
        args.claude, "-p", task.prompt(),
        "--bare",
        "--system-prompt", CLAUDE_SYSTEM,
        "--tools", args.claude_tools,
        "--allowedTools", args.claude_tools,  # pre-approved: no permission prompts
        "--max-turns", str(args.steps),
        "--output-format", "json",
    ]  # fmt: skip
    home = out / "claude-home"
    home.mkdir(exist_ok=True)
    env = agent_env(
        {
            "ANTHROPIC_BASE_URL": base,  # no /v1: Claude Code adds it
            "ANTHROPIC_AUTH_TOKEN": key,  # the per-session key
            "HOME": str(home),  # its own ~/.claude, not yours
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(args.max_tokens),
        }
    )
    result = _run_agent(cmd, env, out / "agent.log", args.agent_timeout, cwd=repo)
    try:  # the last line is Claude Code's JSON result
        last = json.loads(result.log_path.read_text().strip().splitlines()[-1])
        status = "error" if last.get("is_error") else str(last.get("subtype") or "")
        result.exit_status = status or result.exit_status
    except (ValueError, IndexError, AttributeError):
        pass
    return result


def run_reference(
    args: argparse.Namespace, task: Task, repo: Path, out: Path, base: str, key: str
) -> AgentResult:
    """Not an agent: one model call (so the session has a turn to rate), then the task's
    reference fix. Checks the positive path: tests pass -> the verifier rewards +1."""
    t0 = time.monotonic()
    body = {
        "model": args.model.split("/", 1)[-1],
        "messages": [{"role": "user", "content": task.prompt()}],
        "max_tokens": 32,
    }
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    )
    (out / "agent.log").write_text(r.text)
    r.raise_for_status()
    apply_fix(task, repo)
    return AgentResult("reference fix", 1, time.monotonic() - t0, out / "agent.log")


def _run_agent(
    cmd: list[str], env: dict[str, str], log_path: Path, timeout: float, cwd: Path | None = None
) -> AgentResult:
    t0 = time.monotonic()
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
            status = f"exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
    return AgentResult(status, None, time.monotonic() - t0, log_path)


AGENTS = {"mini": run_mini, "claude": run_claude, "reference": run_reference}
AGENT_NAMES = {"mini": "mini-swe-agent", "claude": "claude-code", "reference": "reference-fix"}


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
            log(f"project {args.project}: command verifier -> {HERE / 'verify.py'}")
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
