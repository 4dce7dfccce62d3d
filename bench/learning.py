"""How many ratings does rlgate need to learn a user's taste? One seed of one variant.

The whole product runs (the embedded engine, the gateway, the Celery worker with its verify
pool) on a fresh SQLite data directory, and a simulated user (bench/learning_task.py) sends
it the traffic of a deployed assistant: singleton sessions with one general question each
at temperature 1, about half of them rated with a thumb. Variants:

- ``thumbs``: thumbs only;
- ``comments``: thumbs, half of them with a short comment saying what the user wanted;
- ``followups``: thumbs, and on half of the unrated sessions the user writes a next message
  (a correction, a complaint, thanks) that the rule-based ``next_turn_rules`` source rates.

Every variant trains with trainer/config.py's defaults, except the tempo: a run when
``--train-every`` rated answers wait (the threshold trigger; the schedule is off).

**The curve is counted in ratings, not minutes.** Traffic goes in waves of ``--wave``
sessions; after each wave the driver waits until every rating of the wave is stored (a
follow-up's rating comes from the worker), and while the trainer's trigger is due it waits
for the run to end and its adapter to serve (or not), before the next wave. So a slow
machine slows a run but never changes which policy answered which question. (It does
not make a run reproducible to the token: answers sampled at temperature 1 in batches
whose make-up depends on timing can differ in a token, and a run then goes its own way;
the same seed has reached +30 points after 36 thumbs in one run and never in another.) Every
``--eval-every`` ratings, the held-out questions (subjects never asked in training) are
answered greedily through the gateway, and the share that meets the user's taste is a
point of the curve, with the ratings given so far, the ratings consumed by training and
the serving policy version.

Writes ``<out>/<variant>-seed<seed>.json`` and ``.png``. ``bench/learning_table.py`` runs
seeds x variants and prints the table of ratings needed.

    .venv/bin/python bench/learning.py --variant comments --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import learning_task as task  # noqa: E402

VARIANTS = ("thumbs", "comments", "followups")
PROJECT = "learn"
RULES_SOURCE = "next_turn_rules"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlgate" / "learning"


@dataclass
class Run:
    variant: str
    seed: int
    ratings: int = 0  # thumbs given
    followups: int = 0  # next messages sent (followups variant)
    sessions: int = 0
    liked: int = 0  # training answers that met the taste
    points: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class Traffic:
    """The simulated user's side: chat calls, ratings, follow-ups, over real HTTP."""

    def __init__(self, base: str, agent_key: str, feedback_key: str, run: Run) -> None:
        from rlgate.demo_http import http_client

        self.agent = http_client(base, agent_key)
        self.rater = http_client(base, feedback_key)
        self.run = run

    async def chat(
        self, session: str, messages: list[dict], *, temperature: float, seed: int, max_tokens: int
    ) -> dict[str, Any]:
        r = await self.agent.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": session},
            json={
                "model": "rlgate-policy",
                "messages": messages,
                "temperature": temperature,
                "max_tokens": max_tokens,
                "seed": seed,
            },
        )
        if r.status_code != 200:
            raise RuntimeError(f"chat call: {r.status_code} {r.text[:300]}")
        body = r.json()
        choice = body["choices"][0]
        return {
            "id": body["id"],
            "text": choice["message"].get("content") or "",
            "finish_reason": choice.get("finish_reason"),
            "version": r.headers.get("x-rlgate-policy-version", "?"),
        }

    async def rate(self, interaction_id: str, liked: bool, comment: str | None) -> None:
        body: dict[str, Any] = {"interaction_id": interaction_id, "value": liked, "scale": "binary"}
        if comment:
            body["comment"] = comment
        r = await self.rater.post("/feedback", json=body)
        if r.status_code >= 400:
            raise RuntimeError(f"feedback refused: {r.status_code} {r.text[:300]}")

    async def aclose(self) -> None:
        await self.agent.aclose()
        await self.rater.aclose()


async def wave(traffic: Traffic, user: task.SimulatedUser, size: int, tag: str) -> int:
    """``size`` sessions in parallel, then the user's reactions; returns follow-ups sent.
    Everything random is drawn in order before or after the parallel part, so a seed's
    traffic does not depend on which answer came back first."""
    run = traffic.run
    questions = [user.question() for _ in range(size)]
    seeds = [user.rng.randrange(2**31) for _ in range(size)]
    sessions = [f"{tag}-{run.sessions + i}" for i in range(size)]
    run.sessions += size
    answers = await asyncio.gather(
        *[
            traffic.chat(
                s,
                [{"role": "user", "content": q.text}],
                temperature=task.TEMPERATURE,
                seed=sd,
                max_tokens=task.MAX_TOKENS,
            )
            for s, q, sd in zip(sessions, questions, seeds, strict=True)
        ]
    )
    reactions = [user.react(a["text"], a["finish_reason"]) for a in answers]
    calls = []
    for s, q, a, re in zip(sessions, questions, answers, reactions, strict=True):
        run.liked += task.meets_taste(a["text"], a["finish_reason"])
        if re.thumb is not None:
            run.ratings += 1
            calls.append(traffic.rate(a["id"], re.thumb, re.comment))
        elif re.followup is not None:
            run.followups += 1
            messages = [
                {"role": "user", "content": q.text},
                {"role": "assistant", "content": a["text"]},
                {"role": "user", "content": re.followup},
            ]
            calls.append(traffic.chat(s, messages, temperature=0.0, seed=0, max_tokens=1))
    await asyncio.gather(*calls)
    return sum(1 for r in reactions if r.followup is not None)


async def held_out(traffic: Traffic, questions: list[task.Question], tag: str) -> dict[str, Any]:
    sem = asyncio.Semaphore(16)

    async def one(i: int, q: task.Question) -> dict[str, Any]:
        async with sem:
            return await traffic.chat(
                f"{tag}-{i}",
                [{"role": "user", "content": q.text}],
                temperature=0.0,
                seed=0,
                max_tokens=task.MAX_TOKENS,
            )

    answers = await asyncio.gather(*[one(i, q) for i, q in enumerate(questions)])
    met = [task.meets_taste(a["text"], a["finish_reason"]) for a in answers]
    return {
        "agreement": sum(met) / len(met),
        "versions": sorted({a["version"] for a in answers}),
        "example": answers[0]["text"][:200],
        "mean_words": sum(len(a["text"].split()) for a in answers) / len(answers),
    }


class Trainer:
    """The driver's view of the trainer, read from the database: is a run due, running,
    and which version serves. The trainer itself runs in the worker, on its own beat."""

    def __init__(self, database_url: str, project: str) -> None:
        from core.db import make_engine, session_factory

        self.factory = session_factory(make_engine(database_url))
        self.project = project

    def state(self) -> tuple[bool, bool, int, str]:
        """(a run is due, a run is queued or running, runs so far, serving version)."""
        from sqlalchemy import func, select

        from core.serving_version import serving_version
        from schemas.atdp import RunStatus
        from schemas.tables import ProjectRow, TrainingRunRow
        from trainer.config import TrainConfig
        from trainer.triggers import due_trigger

        with self.factory() as db:
            project = db.get(ProjectRow, self.project)
            cfg = TrainConfig.from_project_settings(project.settings)
            due = due_trigger(db, project, cfg) is not None
            active = db.scalar(
                select(func.count())
                .select_from(TrainingRunRow)
                .where(
                    TrainingRunRow.project_id == self.project,
                    TrainingRunRow.status.in_((RunStatus.queued, RunStatus.running)),
                )
            )
            runs = db.scalar(
                select(func.count())
                .select_from(TrainingRunRow)
                .where(TrainingRunRow.project_id == self.project)
            )
            serving = serving_version(db, self.project)
            name = serving.name if serving is not None else "base"
        return due, bool(active), int(runs or 0), name

    def feedback_count(self, source: str) -> int:
        from sqlalchemy import func, select

        from schemas.tables import FeedbackRow

        with self.factory() as db:
            return int(
                db.scalar(
                    select(func.count())
                    .select_from(FeedbackRow)
                    .where(FeedbackRow.project_id == self.project, FeedbackRow.source == source)
                )
                or 0
            )

    def consumed(self) -> int:
        from sqlalchemy import func, select

        from schemas.tables import InteractionRow

        with self.factory() as db:
            return int(
                db.scalar(
                    select(func.count())
                    .select_from(InteractionRow)
                    .where(
                        InteractionRow.project_id == self.project,
                        InteractionRow.consumed_by_run_id.is_not(None),
                    )
                )
                or 0
            )

    def runs(self) -> list[dict[str, Any]]:
        from sqlalchemy import select

        from schemas.tables import TrainingRunRow

        with self.factory() as db:
            rows = db.scalars(
                select(TrainingRunRow)
                .where(TrainingRunRow.project_id == self.project)
                .order_by(TrainingRunRow.created_at)
            ).all()
            return [run_summary(r.status, r.num_samples, r.error, r.step_metrics) for r in rows]


def run_summary(status: str, samples: int, error: str | None, steps: list[Any]) -> dict[str, Any]:
    """What bounded a run: the steps it took, whether the trust region stopped it (and at
    which KL), the reward and hint advantages it trained on, the distillation KL, and
    how far the engine's logprobs were from the trainer's: the behaviour weights
    ``pi_prox / mu`` (their mean and extremes over the run) and the share of tokens the
    band masked for engine/trainer mismatch."""
    steps = [s for s in steps or [] if isinstance(s, dict)]
    last = steps[-1] if steps else {}

    def mean(key: str) -> float | None:
        vals = [s[key] for s in steps if isinstance(s.get(key), (int, float))]
        return round(sum(vals) / len(vals), 4) if vals else None

    return {
        "status": status,
        "samples": samples,
        "error": error,
        "steps": len(steps),
        "stopped_early": bool(last.get("stopped_early")),
        "stop_kl_prox": last.get("stop_kl_prox"),
        "kl_prox_last": last.get("kl_prox"),
        "reward_mean": mean("reward_mean"),
        "hint_adv_mean": mean("hint_adv_mean"),
        "distill_kl": mean("distill_kl"),
        "masked_mismatch_frac": mean("masked_mismatch_frac"),
        "iw_mean": mean("iw_mean"),
        "iw_min": min((s["iw_min"] for s in steps if "iw_min" in s), default=None),
        "iw_max": max((s["iw_max"] for s in steps if "iw_max" in s), default=None),
    }


async def settle(trainer: Trainer, traffic: Traffic, check_alive, timeout_s: float = 900) -> None:
    """Wait while a run is due or running, then until its adapter serves at the gateway."""
    deadline = time.monotonic() + timeout_s
    waited = False
    while time.monotonic() < deadline:
        check_alive()
        due, active, _, serving = await asyncio.to_thread(trainer.state)
        if not due and not active:
            break
        waited = True
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError(f"the trainer did not settle within {timeout_s:.0f} s")
    if waited:  # the gateway's serving cache (0.5 s) must see the new version
        await asyncio.sleep(1.0)


async def wait_followup_ratings(trainer: Trainer, expected: int, timeout_s: float = 120) -> int:
    """The worker rates follow-ups as they arrive: wait until it wrote ``expected``."""
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        got = await asyncio.to_thread(trainer.feedback_count, "next_turn")
        if got >= expected:
            return got
        await asyncio.sleep(0.3)
    print(f"  (only {got} of {expected} follow-ups were rated in {timeout_s:.0f} s)", flush=True)
    return got


async def drive(args: argparse.Namespace, stack: Any, keys: dict[str, str], trainer: Trainer):
    run = Run(args.variant, args.seed)
    train_subjects, questions = task.split(args.seed)
    user = task.SimulatedUser(args.seed, args.variant, train_subjects)
    traffic = Traffic(stack.base, keys["agent"], keys["feedback"], run)
    tag = f"s{args.seed}-{args.variant}"
    followups_sent = 0

    async def point() -> None:
        _, _, runs, serving = await asyncio.to_thread(trainer.state)
        result = await held_out(traffic, questions, f"{tag}-eval{len(run.points)}")
        p = {
            "ratings": run.ratings,
            "followups": run.followups,
            "consumed": await asyncio.to_thread(trainer.consumed),
            "runs": runs,
            "policy_version": serving,
            "agreement": result["agreement"],
            "mean_words": round(result["mean_words"], 1),
            "answered_by": result["versions"],
            "minutes": round((time.monotonic() - run.started) / 60, 2),
            "example": result["example"],
        }
        run.points.append(p)
        print(
            f"[{p['minutes']:6.1f} min] {p['ratings']:4d} ratings ({p['consumed']} consumed,"
            f" {runs} runs) {serving:>22s}: held-out agreement {p['agreement']:6.1%},"
            f" {p['mean_words']:.0f} words",
            flush=True,
        )

    try:
        await point()
        next_eval = args.eval_every
        while run.ratings < args.ratings:
            stack.check_alive()
            followups_sent += await wave(traffic, user, args.wave, tag)
            if followups_sent:
                await wait_followup_ratings(trainer, followups_sent)
            await settle(trainer, traffic, stack.check_alive)
            if run.ratings >= next_eval:
                await point()
                while next_eval <= run.ratings:
                    next_eval += args.eval_every
        if run.points[-1]["ratings"] != run.ratings:
            await point()
    finally:
        await traffic.aclose()
    return run


def knob_setting(text: str) -> tuple[str, Any]:
    """``KNOB=VALUE`` with a JSON value (a bare word is taken as a string)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KNOB=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def model_dir() -> Path:
    """The packaged model, converted once into the bench's cache (not per run)."""
    from core.settings import Settings
    from engine.model_files import resolve_model_dir

    return resolve_model_dir(Settings().model_path, CACHE)


def setup(data_dir: Path, args: argparse.Namespace) -> tuple[Any, dict[str, str], str]:
    from core import migrate as mig
    from core.db import make_engine, session_factory, transaction
    from core.keys import create_key, ensure_project
    from core.settings import Settings

    os.environ["RLGATE_DATA_DIR"] = str(data_dir)
    os.environ["RLGATE_MODEL_PATH"] = str(model_dir())
    settings = Settings()
    url = settings.effective_database_url
    mig.upgrade(url)
    factory = session_factory(make_engine(url))
    training = {
        **args.training,
        "threshold": args.train_every,
        "schedule_minutes": 10_080.0,
        "seed": args.seed,
    }
    with transaction(factory) as db:
        project = ensure_project(db, PROJECT)
        project.settings = {
            "training": training,
            **({"verifiers": [{"name": RULES_SOURCE}]} if args.variant == "followups" else {}),
        }
        keys = {
            kind: create_key(db, PROJECT, kind, name="learning bench")[1]
            for kind in ("agent", "feedback")
        }
    return settings, keys, url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=VARIANTS, default="thumbs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ratings", type=int, default=80, help="budget of thumbs per run")
    ap.add_argument("--train-every", type=int, default=8, help="the trainer's threshold")
    ap.add_argument("--eval-every", type=int, default=8, help="ratings between curve points")
    ap.add_argument("--wave", type=int, default=16, help="sessions sent at once")
    ap.add_argument(
        "--set",
        dest="training",
        action="append",
        type=knob_setting,
        default=[],
        metavar="KNOB=VALUE",
        help="a training knob other than its default (a JSON value, or a word), e.g. "
        "hint_teacher=policy or hint_weight=2; the README's table uses none",
    )
    ap.add_argument(
        "--engine-weights",
        choices=["float", "int4"],
        default="int4",
        help="the embedded engine's --weights (its default, int4; float: float32, exact to "
        "transformers; docs/engine.md, Weights)",
    )
    ap.add_argument("--port", type=int, default=8700)
    ap.add_argument("--engine-port", type=int, default=30700)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "learning-results")
    ap.add_argument("--keep", action="store_true", help="keep the run's data directory")
    args = ap.parse_args()
    args.training = dict(args.training)

    from rlgate.demo_curve import commit
    from rlgate.up import launch

    data_dir = Path(tempfile.mkdtemp(prefix=f"rlgate-learning-{args.variant}-{args.seed}-"))
    settings, keys, url = setup(data_dir, args)
    stack = launch(
        settings,
        args.port,
        args.engine_port,
        trainer=True,
        extra_env={"RLGATE_TRAIN_TICK_S": "1", "RLGATE_DEFAULT_PROJECT": PROJECT},
        engine_args=(
            "--max-running-requests",
            str(args.wave),
            "--context-length",
            "512",
            "--weights",
            args.engine_weights,
        ),
    )
    print(f"{args.variant}, seed {args.seed}: logs in {stack.logs}", flush=True)

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # unwinds into stack.stop() below

    signal.signal(signal.SIGTERM, on_term)
    failure = None
    run = Run(args.variant, args.seed)
    trainer = Trainer(url, PROJECT)
    try:
        run = asyncio.run(drive(args, stack, keys, trainer))
    except BaseException as e:  # noqa: BLE001 - write what was measured, then say why
        failure = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        runs = trainer.runs()
        stack.stop()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    name = f"{args.variant}-seed{args.seed}"
    data = {
        "variant": args.variant,
        "seed": args.seed,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_at_end": os.getloadavg(),
        "budget": args.ratings,
        "train_every": args.train_every,
        "eval_every": args.eval_every,
        "wave": args.wave,
        "engine_weights": args.engine_weights,
        "training_settings": args.training,
        "training_runs": runs,
        "sessions": run.sessions,
        "train_answers_liked": run.liked,
        "points": run.points,
        "failure": failure,
    }
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    plot([data], out / f"{name}.png", f"{args.variant}, seed {args.seed}")
    if not args.keep:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"wrote {out / name}.json and .png" + (f"; FAILED: {failure}" if failure else ""))
    if failure:
        sys.exit(1)


COLORS = {"thumbs": "tab:blue", "comments": "tab:orange", "followups": "tab:green"}


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    labelled: set[str] = set()
    for data in runs:
        xs = [p["ratings"] for p in data["points"]]
        ys = [100 * p["agreement"] for p in data["points"]]
        v = data["variant"]
        ax.plot(
            xs,
            ys,
            marker="o",
            markersize=3,
            color=COLORS.get(v),
            alpha=0.8,
            label=None if v in labelled else v,
        )
        labelled.add(v)
    ax.set_xlabel("thumbs given (ratings)")
    ax.set_ylabel("held-out agreement with the user's taste (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
