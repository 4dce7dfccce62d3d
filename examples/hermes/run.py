"""Hermes Agent learns to use a tool through rlgate.

A stream of small tasks ("What is 37 * 41?", "Convert 12 miles to km.") is run by the
real Hermes Agent (PyPI ``hermes-agent``, its ``hermes -z`` one-shot mode) configured
through its own ``config.yaml`` to use the gateway as a custom OpenAI-compatible
provider. The example defines the tools (a calculator and a unit converter, a Hermes
user plugin in ``hermes_plugin/calc_tools``). Each task is one gateway session (a
per-session key from ``POST /v1/sessions``); a simulated user checks the final answer
against the truth and rates the session through ``POST /feedback``; every
``--train-every`` tasks the trainer runs (``POST /admin/api/actions/train-now``) and the
new adapter is hot-swapped in. Reward over time goes to ``reward.json`` and
``reward.png``.

Run it from the repository root with the project's venv while ``rlgate up`` runs; see
README.md next to this file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainer.verifiers import last_number  # the project's own number reader

HERE = Path(__file__).resolve().parent
DEFAULT_HERMES = "/tmp/hermesvenv/bin/hermes"
RATER = "simulated-user"
# a run is over when published, failed or cancelled; "trained-not-published" is also the
# status between training and publishing, so it only counts once an error is set
RUN_DONE = ("published", "failed", "cancelled")
# Project.settings["training"] written by --tune-training (see trainer/config.py): a
# LoRA step size that moves a 135M model within a few runs (the demo's values) ...
# micro_batch_tokens 1024: one ~1,000-token Hermes sample per forward. The default (4096)
# puts four in one padded batch, which took ~10 GB of RAM on CPU.
TRAINING: dict[str, Any] = {
    "max_staleness": 4,
    "lr": 2e-4,
    "lora_rank": 16,
    "lora_alpha": 32.0,
    "micro_batch_tokens": 1024,
}
# ... and the triggers. With --train-every this script starts every run itself (manual
# runs ignore the triggers), so the beat never starts one; with --train-every 0 the beat
# trains every few minutes once enough rated samples wait.
MANUAL_TRIGGERS = {"schedule_minutes": 1440.0, "threshold": 1_000_000, "min_samples": 1_000_000}
SCHEDULE_TRIGGERS = {"schedule_minutes": 3.0, "threshold": 32, "min_samples": 8}


# ---- tasks and the simulated user ---------------------------------------------------


@dataclass(frozen=True)
class Task:
    kind: str  # "add", "mul" or "convert"; the session's task_id (per-task baselines)
    prompt: str
    expected: float
    rel_tol: float = 0.0  # arithmetic must be exact; conversions may be rounded


_CONVERSIONS: list[tuple[str, str, float]] = [
    ("miles", "km", 1.609344),
    ("km", "miles", 1 / 1.609344),
    ("kg", "pounds", 1 / 0.45359237),
    ("pounds", "kg", 0.45359237),
    ("feet", "meters", 0.3048),
    ("inches", "cm", 2.54),
    ("gallons", "liters", 3.785411784),
]


def make_task(rng: random.Random) -> Task:
    kind = rng.choice(["add", "mul", "convert"])
    if kind == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        return Task("add", f"What is {a} + {b}?", float(a + b))
    if kind == "mul":
        a, b = rng.randint(11, 49), rng.randint(11, 49)
        return Task("mul", f"What is {a} * {b}?", float(a * b))
    src, dst, factor = rng.choice(_CONVERSIONS)
    value = rng.randint(2, 40)
    if rng.random() < 0.25:
        prompt = f"Convert {value} degrees Celsius to Fahrenheit."
        return Task("convert", prompt, value * 1.8 + 32, rel_tol=5e-3)
    return Task("convert", f"Convert {value} {src} to {dst}.", value * factor, rel_tol=5e-3)


def matches(got: float | None, task: Task) -> bool:
    """Exact for arithmetic; a conversion may be rounded (0.5 %, e.g. 19.3 for 19.312)."""
    return got is not None and math.isclose(got, task.expected, rel_tol=task.rel_tol, abs_tol=1e-9)


def rate(answer: str, task: Task, used_tool: bool) -> tuple[int, str]:
    """The simulated user's 1-5 stars and comment. It reads the final answer (the last
    number in it) and, like a user watching the agent, sees whether a tool was used."""
    got = last_number(answer)
    if matches(got, task):
        return 5, "correct"
    if used_tool:
        return 3, "used a tool, wrong answer"
    if got is not None:
        return 2, "wrong number"
    return 1, "no answer"


def stars_to_reward(stars: float) -> float:
    return (stars - 3) / 2  # the gateway's stars-5 normalization


# ---- Hermes -------------------------------------------------------------------------


@dataclass
class HermesRun:
    answer: str
    exit_code: int
    seconds: float
    tool_calls: list[dict[str, Any]]
    usage: dict[str, Any]
    stderr: str


class Hermes:
    """A private HERMES_HOME (config.yaml, SOUL.md, the calc_tools plugin) and the
    ``hermes -z`` one-shot runner. Nothing under the user's home is touched."""

    def __init__(
        self, binary: str, base_url: str, max_tokens: int, max_turns: int, stop: str
    ) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="rlgate-hermes-"))
        self.home = self.root / "hermes-home"
        self.workdir = self.root / "work"  # cwd without AGENTS.md etc.
        self.workdir.mkdir(parents=True)
        (self.home / "plugins").mkdir(parents=True)
        template = string.Template((HERE / "hermes_config.yaml").read_text())
        config = template.substitute(
            base_url=base_url.rstrip("/"),
            max_tokens=max_tokens,
            max_turns=max_turns,
            extra_body=json.dumps({"stop": [stop]} if stop else {}),
        )
        (self.home / "config.yaml").write_text(config)
        shutil.copy(HERE / "SOUL.md", self.home / "SOUL.md")
        shutil.copytree(
            HERE / "hermes_plugin" / "calc_tools",
            self.home / "plugins" / "calc_tools",
            ignore=shutil.ignore_patterns("__pycache__"),
        )

    def run(self, prompt: str, session_key: str, index: int, timeout_s: float) -> HermesRun:
        tool_log = self.root / f"tools-{index:04d}.jsonl"
        usage_file = self.root / f"usage-{index:04d}.json"
        # not the project's venv, and none of this script's keys: only the session's
        drop = ("PYTHONPATH", "VIRTUAL_ENV", "RLGATE_AGENT_KEY", "RLGATE_EXAMPLE_ADMIN_KEY")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(
            HERMES_HOME=str(self.home),
            HOME=str(self.root),  # belt and braces: nothing lands in the real home
            RLGATE_SESSION_KEY=session_key,
            CALC_TOOLS_LOG=str(tool_log),
        )
        cmd = [self.binary, "-z", prompt, "--toolsets", "calc", "--usage-file", str(usage_file)]
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(killed after {timeout_s:.0f} s)"
        except BaseException:  # Ctrl-C / SIGTERM: leave no Hermes behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        seconds = time.monotonic() - started
        calls = []
        if tool_log.exists():
            calls = [json.loads(line) for line in tool_log.read_text().splitlines() if line]
        usage: dict[str, Any] = {}
        if usage_file.exists():
            usage = json.loads(usage_file.read_text())
        return HermesRun(out.strip(), proc.returncode, seconds, calls, usage, err.strip())

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# ---- the gateway --------------------------------------------------------------------


class Gateway:
    def __init__(self, base_url: str, agent_key: str, admin_key: str | None) -> None:
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=60)
        self.agent = {"Authorization": f"Bearer {agent_key}"}
        self.admin = {"Authorization": f"Bearer {admin_key}"} if admin_key else None

    def _ok(self, r: httpx.Response) -> dict[str, Any]:
        if r.status_code >= 400:
            raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}")
        return r.json()

    def check(self) -> None:
        self._ok(self.http.get("/health"))
        self._ok(self.http.get("/v1/models", headers=self.agent))

    def new_session(self, task: Task) -> dict[str, Any]:
        body = {
            "task_id": task.kind,
            "agent_name": "hermes-agent",
            "metadata": {"task": task.prompt, "expected": task.expected},
        }
        return self._ok(self.http.post("/v1/sessions", json=body, headers=self.agent))

    def session(self, session_id: str) -> dict[str, Any]:
        return self._ok(self.http.get(f"/v1/sessions/{session_id}", headers=self.agent))

    def end_session(self, session_id: str) -> None:
        self._ok(self.http.post(f"/v1/sessions/{session_id}/end", headers=self.agent))

    def rate(self, session_id: str, stars: int, comment: str) -> dict[str, Any]:
        body = {
            "session_id": session_id,
            "value": stars,
            "scale": "stars-5",
            "comment": comment,
            "rater": RATER,
            "source": "user",
            "idempotency_key": f"hermes-example:{session_id}",
        }
        return self._ok(self.http.post("/feedback", json=body, headers=self.agent))

    def train_now(self, project: str) -> str:
        assert self.admin is not None
        r = self.http.post(
            "/admin/api/actions/train-now", json={"project_id": project}, headers=self.admin
        )
        return str(self._ok(r)["run_id"])

    def run(self, run_id: str) -> dict[str, Any]:
        assert self.admin is not None
        return self._ok(self.http.get(f"/admin/api/runs/{run_id}", headers=self.admin))

    def wait_run(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        run: dict[str, Any] = {"id": run_id, "status": "unknown"}
        failing_since: float | None = None
        while True:
            try:
                run = self.run(run_id)
                failing_since = None
            except httpx.TransportError as e:  # a busy machine: keep polling a while
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > 60:
                    raise RuntimeError(f"the gateway does not answer: {e!r}") from e
                print(f"  (polling run {run_id}: {e!r})", flush=True)
            over = run["status"] in RUN_DONE or (
                run["status"] == "trained-not-published" and run.get("error")
            )
            if over or time.monotonic() > deadline:
                return run
            time.sleep(3)


def tune_training(project: str, manual: bool) -> None:
    """Write Project.settings["training"] through rlgate's own database layer (the admin
    API has no settings route). Needs the same RLGATE_DATA_DIR / RLGATE_DATABASE_URL as
    the running `rlgate up`."""
    from core.db import make_engine, session_factory, transaction
    from core.keys import ensure_project
    from core.settings import get_settings

    training = {**TRAINING, **(MANUAL_TRIGGERS if manual else SCHEDULE_TRIGGERS)}
    url = get_settings().effective_database_url
    with transaction(session_factory(make_engine(url, create_dir=False))) as db:
        row = ensure_project(db, project)
        row.settings = {**(row.settings or {}), "training": training}
    print(f"project {project!r}: training settings {training} ({url})")


# ---- the loop -----------------------------------------------------------------------


@dataclass
class Point:
    index: int
    t_s: float
    kind: str
    prompt: str
    expected: float
    answer: str
    stars: int
    reward: float
    comment: str
    used_tool: bool
    turns: int
    policy_version: str
    session_id: str
    hermes_seconds: float
    hermes_exit: int


@dataclass
class TrainEvent:
    after_task: int
    t_s: float
    run_id: str
    status: str
    num_samples: int | None
    policy_version: str | None
    duration_s: float | None
    error: str | None


@dataclass
class Record:
    started_at: str
    args: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    training: list[TrainEvent] = field(default_factory=list)


def run_task(
    gw: Gateway,
    hermes: Hermes,
    task: Task,
    sess: dict[str, Any],
    index: int,
    t0: float,
    timeout_s: float,
) -> Point:
    """Hermes does the task in session ``sess``; the simulated user rates it."""
    sid = sess["id"]
    result = hermes.run(task.prompt, sess["api_key"], index, timeout_s)
    info = gw.session(sid)
    turns = info.get("interactions") or []
    used_tool = bool(result.tool_calls)
    stars, comment = rate(result.answer, task, used_tool)
    if result.exit_code != 0 or result.usage.get("failed"):
        lines = result.stderr.splitlines() + [str(result.usage.get("failure") or ""), result.answer]
        why = next((line for line in lines if line.strip()), "")
        stars, comment = 1, f"agent failed (exit {result.exit_code}): {why[:200]}"
    if turns:  # a run that never reached the model has nothing to rate
        gw.rate(sid, stars, comment)
    gw.end_session(sid)
    point = Point(
        index=index,
        t_s=round(time.monotonic() - t0, 1),
        kind=task.kind,
        prompt=task.prompt,
        expected=round(task.expected, 4),
        answer=result.answer[:500],
        stars=stars,
        reward=stars_to_reward(stars),
        comment=comment,
        used_tool=used_tool,
        turns=len(turns),
        policy_version=str(turns[-1]["policy_version"]) if turns else "-",
        session_id=sid,
        hermes_seconds=round(result.seconds, 1),
        hermes_exit=result.exit_code,
    )
    return point


def train(gw: Gateway, project: str, after: int, t0: float, timeout_s: float) -> TrainEvent:
    run_id = gw.train_now(project)
    print(f"  training run {run_id} queued ...", flush=True)
    run = gw.wait_run(run_id, timeout_s)
    pv = run.get("policy_version") or {}
    return TrainEvent(
        after_task=after,
        t_s=round(time.monotonic() - t0, 1),
        run_id=run_id,
        status=str(run["status"]),
        num_samples=run.get("num_samples"),
        policy_version=pv.get("name"),
        duration_s=run.get("duration_s"),
        error=run.get("error"),
    )


def summary(points: list[Point]) -> list[dict[str, Any]]:
    """Mean reward, accuracy and tool use per serving policy version, in serving order."""
    order: list[str] = []
    for p in points:
        if p.policy_version not in order:
            order.append(p.policy_version)
    rows = []
    for version in order:
        ps = [p for p in points if p.policy_version == version]
        rows.append(
            {
                "policy_version": version,
                "tasks": len(ps),
                "mean_reward": round(sum(p.reward for p in ps) / len(ps), 3),
                "correct": sum(p.stars == 5 for p in ps),
                "used_tool": sum(p.used_tool for p in ps),
            }
        )
    return rows


def plot(record: Record, path: Path, window: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = record.points
    fig, ax = plt.subplots(figsize=(9, 4.5))
    versions = sorted({p.policy_version for p in pts}, key=lambda v: (v != "base", v))
    colors = plt.get_cmap("tab10")
    for i, version in enumerate(versions):
        ps = [p for p in pts if p.policy_version == version]
        ax.scatter(
            [p.index for p in ps],
            [p.reward for p in ps],
            s=18,
            color=colors(i % 10),
            label=f"served by {version}",
            alpha=0.8,
        )
    rolling = []
    for i in range(len(pts)):
        chunk = pts[max(0, i - window + 1) : i + 1]
        rolling.append(sum(p.reward for p in chunk) / len(chunk))
    ax.plot([p.index for p in pts], rolling, color="black", lw=1.5, label=f"mean of last {window}")
    for ev in record.training:
        ax.axvline(ev.after_task - 0.5, color="grey", ls="--", lw=1)
        label = ev.policy_version if ev.status == "published" else ev.status
        ax.text(ev.after_task - 0.4, 1.55, label or "", fontsize=7, rotation=90, va="top")
    last = max([len(pts)] + [ev.after_task for ev in record.training])
    ax.set_xlim(-0.5, last + 0.5)
    ax.set_ylim(-1.1, 1.6)
    ax.set_xlabel("task")
    ax.set_ylabel("reward (user rating, stars-5 -> [-1, 1])")
    ax.set_title(f"Hermes Agent through rlgate, {record.started_at}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not cut cleanup
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--base-url", default=os.environ.get("RLGATE_BASE_URL", "http://127.0.0.1:8100")
    )
    ap.add_argument("--key", default=os.environ.get("RLGATE_AGENT_KEY"), help="agent key")
    ap.add_argument(
        "--admin-key",
        default=os.environ.get("RLGATE_EXAMPLE_ADMIN_KEY"),
        help="admin key of the project (for train-now and run status)",
    )
    ap.add_argument("--hermes", default=os.environ.get("HERMES_BIN", DEFAULT_HERMES))
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--train-every", type=int, default=8, help="0: leave it to the schedule")
    ap.add_argument("--tune-training", action="store_true", help="write TRAINING to the project")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each call")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument(
        "--stop",
        default="\n\n",
        help="stop sequence sent with every request (default: a blank line); '' for none",
    )
    ap.add_argument("--task-timeout", type=float, default=180)
    ap.add_argument("--train-timeout", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("hermes-example-out"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # unwinds like Ctrl-C: results are written
    if not args.key:
        ap.error("--key (or RLGATE_AGENT_KEY) is required: the agent key `rlgate up` printed")
    if args.train_every and not args.admin_key:
        ap.error("--admin-key (or RLGATE_EXAMPLE_ADMIN_KEY) is required with --train-every")
    if not shutil.which(args.hermes):
        ap.error(f"no Hermes Agent at {args.hermes}; see README.md (pip install hermes-agent)")

    gw = Gateway(args.base_url, args.key, args.admin_key)
    gw.check()
    hermes = Hermes(args.hermes, args.base_url, args.max_tokens, args.max_turns, args.stop)
    print(f"HERMES_HOME {hermes.home}; gateway {args.base_url}; {args.tasks} tasks")
    rng = random.Random(args.seed)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    shown = {k: str(v) for k, v in vars(args).items() if "key" not in k}
    record = Record(started_at=stamp, args=shown)
    t0 = time.monotonic()
    status = 0
    try:
        for i in range(args.tasks):
            task = make_task(rng)
            sess = gw.new_session(task)
            project = str(sess["project_id"])
            if i == 0 and args.tune_training:
                tune_training(project, manual=args.train_every > 0)
            point = run_task(gw, hermes, task, sess, i, t0, args.task_timeout)
            record.points.append(point)
            tool = "tool" if point.used_tool else "    "
            print(
                f"[{point.t_s:6.0f}s] #{i:<3} {point.policy_version:<18} {tool} "
                f"{point.stars}* {task.prompt:<40} -> {point.answer[:60]!r}",
                flush=True,
            )
            if args.train_every and (i + 1) % args.train_every == 0:
                ev = train(gw, project, i + 1, t0, args.train_timeout)
                record.training.append(ev)
                took = f"{ev.duration_s:.0f} s" if ev.duration_s is not None else "?"
                print(
                    f"  run {ev.run_id}: {ev.status}, {ev.num_samples} samples, {took} "
                    f"-> {ev.policy_version} {ev.error or ''}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("interrupted; writing what there is")
        status = 130
    except (RuntimeError, httpx.HTTPError) as e:
        print(f"stopped: {e}; writing what there is")
        status = 1
    finally:
        hermes.cleanup()
    args.out.mkdir(parents=True, exist_ok=True)
    data = asdict(record)
    data["summary"] = summary(record.points)
    (args.out / "reward.json").write_text(json.dumps(data, indent=2))
    if record.points:
        plot(record, args.out / "reward.png")
    print("\npolicy version       tasks  mean reward  correct  used tool")
    for row in data["summary"]:
        print(
            f"{row['policy_version']:<20} {row['tasks']:>5}  {row['mean_reward']:>11.3f}  "
            f"{row['correct']:>7}  {row['used_tool']:>9}"
        )
    print(f"wrote {args.out / 'reward.json'} and {args.out / 'reward.png'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
