"""Hot swap latency: trainer done (adapter saved, candidate version committed) -> first
request served by the new version, on the embedded engine. The publish's steps are timed
apart (load into the engine, warm-up token, the serving switch's transaction, the old
version's retirement); as a gateway would, the first request goes out as soon as the
switch is committed, beside the retirement: the gateway's serving lookup
(``ServingPolicy``) and a /generate of a 40-token prompt and one token with the new
adapter. The same request on another 40-token prompt, once the publish is over, is the
request's own cost: what the first one took beyond it is the new adapter's first use.

    .venv/bin/python bench/hot_swap.py [--engine-url URL] [--rounds 3] [--database-url URL]
        [--engine-weights float|int4]

With a PostgreSQL ``--database-url`` (an empty database; it is migrated) it also times the
notice that makes a running gateway drop its cached pointer (core/serving_events.py): from
the start of the publish to a listener's callback. On SQLite a running gateway sees the
switch when its cache expires (RLGATE_SERVING_CACHE_S, default 0.5 s).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core import serving_events  # noqa: E402
from core.db import make_engine, session_factory, transaction  # noqa: E402
from core.migrate import upgrade  # noqa: E402
from core.settings import Settings  # noqa: E402
from engine.lora import DEFAULT_TARGET_MODULES  # noqa: E402
from gateway.engines.serving_cache import ServingPolicy  # noqa: E402
from schemas.convert import to_row  # noqa: E402
from schemas.tables import ProjectRow  # noqa: E402
from tests.rows import policy_version  # noqa: E402
from tests.servers import MODEL_CACHE, engine_cmd, free_port, running  # noqa: E402
from trainer import publish  # noqa: E402
from trainer.serving_switch import publish_version  # noqa: E402


def make_adapter(model_dir: Path, out: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    pm = get_peft_model(
        model,
        LoraConfig(r=8, lora_alpha=16, target_modules=list(DEFAULT_TARGET_MODULES)),
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    pm.save_pretrained(str(out))


STEPS = ("load", "warm", "switch", "retire")


class _Clock:
    """Starts at trainer done; ``served``: when ``first_request``, started at the switch,
    had its answer."""

    def __init__(self, first_request: Callable[[], None]) -> None:
        self.t0 = time.perf_counter()
        self.served = 0.0
        self.thread = threading.Thread(target=self._run, args=(first_request,))

    def _run(self, first_request: Callable[[], None]) -> None:
        first_request()
        self.served = time.perf_counter() - self.t0

    def join(self) -> None:
        self.thread.join()


@contextlib.contextmanager
def timed_steps(steps: dict[str, float], first_request: Callable[[], None]) -> Iterator[_Clock]:
    """Time the publish's steps (trainer/publish.py, as trainer/serving_switch.py calls
    them) into ``steps``; start ``first_request`` once the switch is committed."""
    clock = _Clock(first_request)
    names = dict(zip(STEPS, ("load_everywhere", "warm", "switch_serving", "retire"), strict=True))
    saved = {k: getattr(publish, f) for k, f in names.items()}

    def wrap(key: str) -> Callable[..., object]:
        def call(*args: object, **kw: object) -> object:
            t = time.perf_counter()
            try:
                return saved[key](*args, **kw)
            finally:
                steps[key] = time.perf_counter() - t
                if key == "switch":
                    steps["to_switch"] = time.perf_counter() - clock.t0
                    clock.thread.start()

        return call

    for key, attr in names.items():
        setattr(publish, attr, wrap(key))
    try:
        yield clock
    finally:
        for key, attr in names.items():
            setattr(publish, attr, saved[key])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-url", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--database-url", default="", help="PostgreSQL: also time the notice")
    ap.add_argument(
        "--engine-weights", choices=["float", "int4"], default="int4", help="engine --weights"
    )
    a = ap.parse_args()
    from engine.model_files import PACKAGED_MODEL, resolve_model_dir

    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    tmp = Path(tempfile.mkdtemp(prefix="rlgate-hotswap-"))
    with contextlib.ExitStack() as stack:
        url = a.engine_url
        if not url:
            port = free_port()
            cmd = engine_cmd(port, "--context-length", "512", "--weights", a.engine_weights)
            url = stack.enter_context(running(cmd, {}, tmp / "engine.log", port, 300)).url
        db_url = a.database_url or f"sqlite:///{tmp / 'bench.db'}"
        upgrade(db_url)
        factory = session_factory(make_engine(db_url))
        noticed: queue.Queue[float] = queue.Queue()
        listener = None
        if serving_events.listens(db_url):
            listener = serving_events.Listener(db_url, lambda _p: noticed.put(time.perf_counter()))
            listener.start()
            listener.ready.wait(10)
        settings = Settings(data_dir=tmp, database_url=db_url, engine_urls=url)
        pid = "bench"
        with transaction(factory) as db:
            db.add(ProjectRow(id=pid, name=pid))
        client = stack.enter_context(httpx.Client(base_url=url, timeout=60))

        def generate(adapter: str | None, prompt: int) -> None:
            """One token after the 40-token prompt number ``prompt`` (each used once, so
            that no request finds its prompt in the engine's prefix cache)."""
            ids = list(range(100 + 40 * prompt, 140 + 40 * prompt))
            body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}
            client.post("/generate", json={**body, "lora_path": adapter}).raise_for_status()

        def first_request(name: str, prompt: int) -> None:
            serving = ServingPolicy(factory).adapter_for(pid)  # a gateway's fresh lookup
            assert serving == name, serving
            generate(serving, prompt)

        generate(None, 0)  # the connection and the engine's first step, outside the clock
        for v in range(1, a.rounds + 1):
            name = f"{pid}-policy-v{v}-{os.getpid()}"
            make_adapter(model_dir, tmp / name, v)
            with transaction(factory) as db:
                db.add(to_row(policy_version(pid, v, id=f"pv{v}", name=name, path=str(tmp / name))))
            steps: dict[str, float] = {}
            with timed_steps(steps, functools.partial(first_request, name, 2 * v - 1)) as clock:
                assert publish_version(factory, settings, f"pv{v}")
                clock.join()
            again = time.perf_counter()
            generate(name, 2 * v)  # the same shape, another prompt
            steady = time.perf_counter() - again
            seen = ""
            if listener is not None:
                seen = f"; the notice at a gateway {noticed.get(timeout=10) - clock.t0:.3f} s"
            parts = ", ".join(f"{k} {steps[k] * 1000:.0f} ms" for k in STEPS if k in steps)
            first = clock.served - steps["to_switch"]
            print(
                f"v{v}: trainer done -> first request served {clock.served * 1000:.0f} ms "
                f"(target < 100): {parts}; serving after {steps['to_switch'] * 1000:.0f} ms, "
                f"then lookup + first request {first * 1000:.0f} ms (the same request on "
                f"another prompt after the publish {steady * 1000:.0f} ms){seen}"
            )
        if listener is not None:
            listener.stop()
        else:
            print(
                "note: on SQLite a running gateway re-reads the serving pointer when its cache "
                f"expires (RLGATE_SERVING_CACHE_S, {settings.serving_cache_s} s), which it "
                "adds at most; on PostgreSQL the switch's notice drops it at once"
            )


if __name__ == "__main__":
    main()
