"""`rlgate demo`: watch an agent learn arithmetic through the gateway.

The whole product runs: the embedded engine, the gateway, the Celery trainer with its
schedule. An agent loop talks to the gateway over real HTTP with the OpenAI SDK on
"What is a + b? Reply with only the number." (a, b in 1..20), `n` answers per question
(a GRPO group); an exact-match verifier rates every answer through `POST /feedback`;
training runs on its schedule and hot-swaps adapters; after a swap (at most once per
``--eval-every`` seconds) a held-out set is answered greedily through the gateway.
Training traffic keeps flowing while the trainer works and while the held-out set is
evaluated. Prints accuracy over time and writes
`curve.json` and `curve.png`. The task (questions, verifier, split, eval gate) is in
``rlgate/demo_task.py``, the curve and its plot in ``rlgate/demo_curve.py``.

The project trains with trainer/config.py's defaults (trust region, KL to the base model,
guards) except the tempo settings in ``TRAINING``, the seed and the eval gate: before a
new adapter serves, it answers a validation split of questions (never the held-out set
the curve reports) greedily, scored by the registered ``exact_number`` verifier, and
must not be worse than the serving one. ``--seed`` seeds the question split and order,
the sampling seed of every request, and the trainer.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from pathlib import Path

import click
import httpx

from core.settings import Settings
from rlgate.demo_curve import Curve, commit, plot
from rlgate.demo_task import (
    MAX_TOKENS,
    PROJECT,
    SAMPLING_TEMPERATURE,
    TRAINING,
    eval_gate,
    exact_match,
    messages,
    score,
    split_pairs,
)
from schemas.atdp import PolicyStatus


class Demo:
    def __init__(
        self, base: str, agent_key: str, admin_key: str, group: int, concurrency: int, seed: int
    ) -> None:
        from openai import AsyncOpenAI

        self.client = AsyncOpenAI(
            base_url=f"{base}/v1", api_key=agent_key, max_retries=3, timeout=300
        )
        self.http = httpx.AsyncClient(
            base_url=base, timeout=60, headers={"Authorization": f"Bearer {agent_key}"}
        )
        self.admin = {"Authorization": f"Bearer {admin_key}"}
        self.group = group
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.version = "base"

    async def ask(self, a: int, b: int, *, n: int, temperature: float) -> tuple[str, object]:
        raw = await self.client.chat.completions.with_raw_response.create(
            model="rlgate-policy",
            messages=messages(a, b),
            n=n,
            temperature=temperature,
            max_tokens=MAX_TOKENS,
            seed=self.rng.randrange(2**31),
        )
        return raw.headers.get("x-rlgate-policy-version", "?"), raw.parse()

    async def train_worker(
        self, pairs: list[tuple[int, int]], curve: Curve, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            a, b = self.rng.choice(pairs)
            try:
                _, resp = await self.ask(a, b, n=self.group, temperature=SAMPLING_TEMPERATURE)
            except Exception as e:  # noqa: BLE001 - a demo keeps going, and says why
                click.echo(f"  (request failed: {e}; retrying)", err=True)
                await asyncio.sleep(1)
                continue
            for choice in resp.choices:
                value = score(choice.message.content, a + b)
                curve.train_answers += 1
                curve.train_correct += value == 1.0
                target = resp.id if self.group == 1 else f"{resp.id}.{choice.index}"
                body = {
                    "interaction_id": target,
                    "value": value,
                    "scale": "scalar",
                    "source": "verifier",
                    "rater": "exact-match",
                }
                r = await self._call("POST", "/feedback", json=body)
                if r is not None and r.status_code >= 400:
                    click.echo(f"  (feedback refused: {r.status_code} {r.text[:200]})", err=True)

    async def _call(self, method: str, url: str, **kwargs: object) -> httpx.Response | None:
        """One gateway call, tried up to 3 times on a transport error (a kept-alive
        connection the server closed at the same moment is one); None when all fail."""
        for attempt in range(3):
            try:
                return await self.http.request(method, url, **kwargs)  # type: ignore[arg-type]
            except httpx.TransportError as e:
                if attempt == 2:
                    click.echo(f"  ({method} {url} failed: {e!r}; going on)", err=True)
                await asyncio.sleep(0.5)
        return None

    async def evaluate(self, pairs: list[tuple[int, int]]) -> tuple[str, float]:
        sem = asyncio.Semaphore(self.concurrency)
        versions: set[str] = set()

        async def one(a: int, b: int) -> bool:
            async with sem:
                version, resp = await self.ask(a, b, n=1, temperature=0.0)
                versions.add(version)
                return exact_match(resp.choices[0].message.content, a + b)

        results = await asyncio.gather(*[one(a, b) for a, b in pairs])
        return ",".join(sorted(versions)), sum(results) / len(results)

    async def serving(self) -> str:
        r = await self._call(
            "GET", "/admin/api/adapters", params={"project": PROJECT}, headers=self.admin
        )
        if r is None or r.status_code != 200:
            return self.version
        for item in r.json()["items"]:
            if item["status"] == PolicyStatus.serving:
                return item["name"]
        return "base"


async def _run(
    base: str,
    agent_key: str,
    admin_key: str,
    minutes: float,
    eval_size: int,
    eval_every: float,
    group: int,
    concurrency: int,
    seed: int,
    curve: Curve,
    check_alive,
) -> None:
    train_pairs, eval_pairs, _ = split_pairs(eval_size, seed)
    demo = Demo(base, agent_key, admin_key, group, concurrency, seed)
    click.echo(f"evaluating the base model on {len(eval_pairs)} held-out questions ...")
    version, acc = await demo.evaluate(eval_pairs)
    curve.add(version, acc, len(eval_pairs))
    click.echo(f"[{0:5.1f} min] {version:>18s}  held-out accuracy {acc:6.1%}")
    stop = asyncio.Event()
    workers = [
        asyncio.create_task(demo.train_worker(train_pairs, curve, stop))
        for _ in range(max(1, concurrency // group))
    ]
    deadline = curve.started + minutes * 60
    last_print = 0.0
    last_eval = time.monotonic()
    seen = (0, 0)  # (answers, correct) at the last progress line

    async def evaluate_now(elapsed: float) -> None:
        version, acc = await demo.evaluate(eval_pairs)
        curve.add(version, acc, len(eval_pairs))
        click.echo(
            f"[{elapsed:5.1f} min] {version:>18s}  held-out accuracy {acc:6.1%}"
            f"   (trained on {curve.train_answers} rated answers)"
        )

    try:
        while time.monotonic() < deadline:
            check_alive()
            await asyncio.sleep(2)
            now_serving = await demo.serving()
            elapsed = (time.monotonic() - curve.started) / 60
            if now_serving != demo.version and time.monotonic() - last_eval >= eval_every:
                demo.version = now_serving
                last_eval = time.monotonic()
                await evaluate_now(elapsed)
            elif time.monotonic() - last_print > 30:
                last_print = time.monotonic()
                answers = curve.train_answers - seen[0]
                correct = curve.train_correct - seen[1]
                seen = (curve.train_answers, curve.train_correct)
                click.echo(
                    f"[{elapsed:5.1f} min] {now_serving:>18s}  "
                    f"{curve.train_answers} answers rated; {correct / max(1, answers):.1%} "
                    "of the last ones exactly right (sampled at temperature "
                    f"{SAMPLING_TEMPERATURE:g})"
                )
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
    try:
        final = await demo.serving()
        if final != demo.version:  # the curve ends with the adapter serving at the end
            demo.version = final
            await evaluate_now((time.monotonic() - curve.started) / 60)
    finally:
        await demo.http.aclose()


def run_demo(
    settings: Settings,
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
) -> None:
    import platform

    from core import migrate as mig
    from core.db import make_engine, session_factory, transaction
    from core.keys import create_key, ensure_project
    from engine.model_files import resolve_model_dir
    from rlgate.up import launch

    mig.upgrade(settings.effective_database_url)
    factory = session_factory(make_engine(settings.effective_database_url))
    _, _, validation = split_pairs(eval_size, seed)
    gate = eval_gate(resolve_model_dir(settings.model_path, settings.data_dir), validation)
    training = {**TRAINING, "seed": seed, "eval_gate": gate}
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
        extra_env={"RLGATE_TRAIN_TICK_S": "2", "RLGATE_DEFAULT_PROJECT": PROJECT},
        # prompts are ~50 tokens: a short context keeps the KV cache of many slots small
        engine_args=(
            *("--max-running-requests", str(max(16, concurrency))),
            *("--context-length", "512"),
        ),
    )
    click.echo(f"rlgate demo: {minutes:g} minutes, groups of {group}, logs in {stack.logs}")
    curve = Curve()

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # unwinds into stack.stop() below

    signal.signal(signal.SIGTERM, on_term)
    try:
        asyncio.run(
            _run(
                stack.base,
                agent_key,
                admin_key,
                minutes,
                eval_size,
                eval_every,
                group,
                concurrency,
                seed,
                curve,
                stack.check_alive,
            )
        )
    finally:
        stack.stop()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()}, {__import__('os').cpu_count()} cores"
    summary = {
        "date": stamp,
        "machine": machine,
        "commit": commit(),
        "seed": seed,
        "minutes": minutes,
        "group_size": group,
        "concurrency": concurrency,
        "eval_size": eval_size,
        "sampling": {"temperature": SAMPLING_TEMPERATURE, "max_tokens": MAX_TOKENS},
        "training": {k: v for k, v in training.items() if k != "eval_gate"},
        "points": curve.points,
        "train_answers": curve.train_answers,
    }
    (out / "curve.json").write_text(json.dumps(summary, indent=2))
    plot(curve, out / "curve.png", f"rlgate demo, seed {seed}, {stamp}, {machine}, {minutes:g} min")
    first, last = curve.points[0], curve.points[-1]
    best = max(p["heldout_accuracy"] for p in curve.points)
    swaps = len({p["policy_version"] for p in curve.points}) - 1
    reached = next((p["minutes"] for p in curve.points if p["heldout_accuracy"] >= 0.5), None)
    click.echo(
        f"\nheld-out accuracy: {first['heldout_accuracy']:.1%} (base) -> "
        f"{last['heldout_accuracy']:.1%} (last), best {best:.1%}"
        + (f", 50% first at minute {reached:.1f}" if reached is not None else "")
        + f"; {swaps} evaluated adapter versions (newest {last['policy_version']}); "
        f"{curve.train_answers} rated answers"
    )
    click.echo(f"wrote {out / 'curve.json'} and {out / 'curve.png'}")
    if require_swap and (swaps < 1 or len(curve.points) < 2):
        raise click.ClickException("no adapter was trained and swapped in within the time")
