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
README.md next to this file. The tasks and the simulated user are in ``hermes_tasks.py``,
the Hermes runner in ``hermes_runner.py``, the record and plot in ``hermes_record.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hermes_record import Point, Record, TrainEvent, plot, summary  # noqa: E402
from hermes_runner import Hermes  # noqa: E402
from hermes_tasks import Task, make_task, rate, stars_to_reward  # noqa: E402

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
