"""`rlgate demo`: watch an agent learn through the gateway.

The whole product runs: the embedded engine, the gateway, the Celery trainer with its
schedule. An agent loop (rlgate/demo_agents.py) talks to the gateway over real HTTP with
the OpenAI SDK and rates what it gets through ``POST /feedback``; training runs on its
schedule and hot-swaps adapters; after a swap (at most once per ``--eval-every`` seconds)
a held-out set is answered greedily through the gateway. Training traffic keeps flowing
while the trainer works and while the held-out set is evaluated. Prints success over time
and writes ``curve.json`` and ``curve.png`` (rlgate/demo_curve.py).

Two tasks:

- ``arithmetic`` (default): "What is a + b? Reply with only the number." after one worked
  exchange, ``n`` answers per question (a GRPO group), each rated by exact match
  (rlgate/demo_task.py).
- ``tools``: a tool loop, three lookup tools; the agent must call the one the question
  needs and answer with its value. ``group`` sibling sessions per question, one rating
  per session at its end (rlgate/demo_tools.py).

Both train with the same settings: trainer/config.py's defaults (trust region, KL to the
base model, guards) except the tempo settings in ``TRAINING``, the seed and the eval gate:
before a new adapter serves, it answers a validation split (never the held-out set the
curve reports) greedily, scored by a registered verifier, and must not be worse than the
serving one. ``--seed`` seeds the question split and order, the sampling seed of every
request, and the trainer.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from core.settings import Settings
from rlgate import demo_task, demo_tools
from rlgate.demo_agents import Agent, ArithmeticAgent, ToolAgent
from rlgate.demo_curve import Curve, commit, plot
from rlgate.demo_task import PROJECT, SAMPLING_TEMPERATURE, TRAINING
from schemas.atdp import PolicyStatus

TASKS = ("arithmetic", "tools")


@dataclass
class TaskSetup:
    """What differs between the tasks: the questions, the gate, the agent, the engine."""

    train: list[Any]
    held_out: list[Any]
    gate: dict
    context_length: int
    max_tokens: int
    make_agent: Any  # (base, agent_key) -> Agent

    @classmethod
    def build(cls, task: str, model_dir: Path, eval_size: int, seed: int, group: int):
        if task == "arithmetic":
            train, held, val = demo_task.split_pairs(eval_size, seed)
            return cls(
                train,
                held,
                demo_task.eval_gate(model_dir, val),
                512,  # prompts are ~50 tokens: a short context keeps each slot's KV small
                demo_task.MAX_TOKENS,
                lambda base, key: ArithmeticAgent(base, key, seed, group, train),
            )
        train, held, val = demo_tools.split_questions(eval_size, seed, demo_task.GATE_SIZE)
        known = demo_tools.facts(seed)
        return cls(
            train,
            held,
            demo_tools.eval_gate(model_dir, val, 1024),
            1024,  # ~600 prompt tokens (tools prompt, three worked sessions) + the loop
            demo_tools.MAX_TOKENS,
            lambda base, key: ToolAgent(base, key, seed, group, train, known),
        )


async def evaluate(agent: Agent, questions: list[Any], concurrency: int) -> tuple[str, float]:
    sem = asyncio.Semaphore(concurrency)
    versions: set[str] = set()

    async def one(q: Any) -> bool:
        async with sem:
            version, right = await agent.answer(q)
            versions.add(version)
            return right

    results = await asyncio.gather(*[one(q) for q in questions])
    return ",".join(sorted(versions)), sum(results) / len(results)


async def serving(agent: Agent, admin_key: str, current: str) -> str:
    r = await agent.call(
        "GET",
        "/admin/api/adapters",
        params={"project": PROJECT},
        headers={"Authorization": f"Bearer {admin_key}"},
    )
    if r is None or r.status_code != 200:
        return current
    for item in r.json()["items"]:
        if item["status"] == PolicyStatus.serving:
            return item["name"]
    return "base"


async def _train_worker(agent: Agent, curve: Curve, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            right = await agent.train_round()
        except Exception as e:  # noqa: BLE001 - a demo keeps going, and says why
            click.echo(f"  (a round failed: {e!r}; retrying)", err=True)
            await asyncio.sleep(1)
            continue
        curve.train_answers += len(right)
        curve.train_correct += sum(right)


async def _run(
    setup: TaskSetup,
    base: str,
    agent_key: str,
    admin_key: str,
    minutes: float,
    eval_every: float,
    workers: int,
    concurrency: int,
    curve: Curve,
    check_alive,
    until_swap: bool = False,
) -> None:
    agent: Agent = setup.make_agent(base, agent_key)
    held = setup.held_out
    click.echo(f"evaluating the base model on {len(held)} held-out questions ...")
    version, acc = await evaluate(agent, held, concurrency)
    curve.add(version, acc, len(held))
    click.echo(f"[{0:5.1f} min] {version:>18s}  held-out success {acc:6.1%}")
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_train_worker(agent, curve, stop)) for _ in range(workers)]
    deadline = curve.started + minutes * 60
    last_print = 0.0
    last_eval = time.monotonic()
    seen = (0, 0)  # (rated, right) at the last progress line
    current = "base"

    async def evaluate_now(elapsed: float) -> None:
        version, acc = await evaluate(agent, held, concurrency)
        curve.add(version, acc, len(held))
        click.echo(
            f"[{elapsed:5.1f} min] {version:>18s}  held-out success {acc:6.1%}"
            f"   (trained on {curve.train_answers} rated {agent.unit})"
        )

    try:
        while time.monotonic() < deadline:
            check_alive()
            await asyncio.sleep(2)
            now_serving = await serving(agent, admin_key, current)
            elapsed = (time.monotonic() - curve.started) / 60
            if now_serving != current and time.monotonic() - last_eval >= eval_every:
                current = now_serving
                last_eval = time.monotonic()
                await evaluate_now(elapsed)
                if until_swap and current != "base":
                    break
            elif time.monotonic() - last_print > 30:
                last_print = time.monotonic()
                rated = curve.train_answers - seen[0]
                right = curve.train_correct - seen[1]
                seen = (curve.train_answers, curve.train_correct)
                click.echo(
                    f"[{elapsed:5.1f} min] {now_serving:>18s}  "
                    f"{curve.train_answers} {agent.unit} rated; {right / max(1, rated):.1%} "
                    "of the last ones right (sampled at temperature "
                    f"{SAMPLING_TEMPERATURE:g})"
                )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    try:
        final = await serving(agent, admin_key, current)
        # the curve ends with the adapter serving at the end; --until-swap ends with the
        # first one's point (another may have been published while it was evaluated)
        if final != current and not until_swap:
            await evaluate_now((time.monotonic() - curve.started) / 60)
    finally:
        await agent.http.aclose()


def run_demo(
    settings: Settings,
    task: str,
    minutes: float,
    port: int,
    engine_port: int,
    out: Path,
    eval_size: int,
    eval_every: float,
    group: int,
    concurrency: int,
    seed: int,
    require_swap: bool,
    until_swap: bool = False,
) -> None:
    from core import migrate as mig
    from core.db import make_engine, session_factory, transaction
    from core.keys import create_key, ensure_project
    from engine.model_files import resolve_model_dir
    from rlgate.up import launch

    mig.upgrade(settings.effective_database_url)
    factory = session_factory(make_engine(settings.effective_database_url))
    model_dir = resolve_model_dir(settings.model_path, settings.data_dir)
    setup = TaskSetup.build(task, model_dir, eval_size, seed, group)
    training = {**TRAINING, "seed": seed, "eval_gate": setup.gate}
    with transaction(factory) as db:
        project = ensure_project(db, PROJECT)
        project.settings = {**(project.settings or {}), "training": training}
        _, agent_key = create_key(db, PROJECT, "agent", name="rlgate demo")
        _, admin_key = create_key(db, PROJECT, "admin", name="rlgate demo")
    stack = launch(
        settings,
        port,
        engine_port,
        trainer=True,
        extra_env={
            "RLGATE_TRAIN_TICK_S": "2",
            "RLGATE_DEFAULT_PROJECT": PROJECT,
            # the demo's one agent key sends --concurrency calls at once
            "RLGATE_MAX_CONCURRENT_PER_KEY": str(max(32, concurrency)),
        },
        engine_args=(
            *("--max-running-requests", str(max(16, concurrency))),
            *("--context-length", str(setup.context_length)),
        ),
    )
    click.echo(
        f"rlgate demo --task {task}: {minutes:g} minutes, groups of {group}, logs in {stack.logs}"
    )
    curve = Curve()

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # unwinds into stack.stop() below

    signal.signal(signal.SIGTERM, on_term)
    # the arithmetic agent's round is one request of n answers, the tool agent's is
    # `group` sessions in flight at once: either way ~concurrency requests in flight
    workers = max(1, concurrency // group)
    failure: str | None = None
    try:
        asyncio.run(
            _run(
                setup,
                stack.base,
                agent_key,
                admin_key,
                minutes,
                eval_every,
                workers,
                concurrency,
                curve,
                stack.check_alive,
                until_swap,
            )
        )
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as e:  # noqa: BLE001 - any failure: write the curve, then one line
        failure = what_failed(e)
    finally:
        stack.stop()
    summary = {
        "task": task,
        "seed": seed,
        "minutes": minutes,
        "group_size": group,
        "concurrency": concurrency,
        "eval_size": len(setup.held_out),
        "sampling": {"temperature": SAMPLING_TEMPERATURE, "max_tokens": setup.max_tokens},
        "training": {k: v for k, v in training.items() if k != "eval_gate"},
    }
    write_results(curve, out, summary, failure)
    if (require_swap or until_swap) and len({p["policy_version"] for p in curve.points}) < 2:
        raise click.ClickException("no adapter was trained and swapped in within the time")


def what_failed(e: BaseException) -> str:
    """One line for an exception: its type and the first line of its message (a
    ClickException from check_alive: its first line; the log tail went to stderr)."""
    if isinstance(e, click.ClickException):
        lines = e.format_message().splitlines()
        if len(lines) > 1:
            click.echo("\n".join(lines[1:]), err=True)
        return lines[0] if lines else type(e).__name__
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def write_results(curve: Curve, out: Path, summary: dict, failure: str | None) -> None:
    """Write curve.json and curve.png of what was measured, whatever happened, and print
    the summary; after a ``failure``, exit 1 with one line saying what failed."""
    import os
    import platform

    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    elapsed = (time.monotonic() - curve.started) / 60
    data = {
        "task": summary["task"],
        "date": stamp,
        "machine": machine,
        "commit": commit(),
        **{k: v for k, v in summary.items() if k != "task"},
        "points": curve.points,
        "train_answers": curve.train_answers,
        "failure": None if failure is None else f"at minute {elapsed:.1f}: {failure}",
    }
    (out / "curve.json").write_text(json.dumps(data, indent=2))
    title = (
        f"rlgate demo --task {summary['task']}, seed {summary['seed']}, {stamp}, {machine}, "
        f"{summary['minutes']:g} min" + (" (stopped early)" if failure else "")
    )
    plot(curve, out / "curve.png", title)
    written = f"wrote {out / 'curve.json'} and {out / 'curve.png'}"
    if curve.points:
        first, last = curve.points[0], curve.points[-1]
        best = max(p["heldout_accuracy"] for p in curve.points)
        swaps = len({p["policy_version"] for p in curve.points}) - 1
        reached = next((p["minutes"] for p in curve.points if p["heldout_accuracy"] >= 0.5), None)
        unit = "sessions" if summary["task"] == "tools" else "answers"
        click.echo(
            f"\nheld-out success: {first['heldout_accuracy']:.1%} (base) -> "
            f"{last['heldout_accuracy']:.1%} (last), best {best:.1%}"
            + (f", 50% first at minute {reached:.1f}" if reached is not None else "")
            + f"; {swaps} evaluated adapter versions (newest {last['policy_version']}); "
            f"{curve.train_answers} rated {unit}"
        )
    if failure is None:
        click.echo(written)
        return
    points = f"{len(curve.points)} held-out point{'s' if len(curve.points) != 1 else ''}"
    raise click.ClickException(
        f"the demo stopped at minute {elapsed:.1f}: {failure}; {written} ({points})"
    )
