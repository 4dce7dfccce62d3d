"""Hot swap latency: trainer done (adapter saved, candidate version committed) -> first
request served by the new version, on the embedded engine. Measures publish (load into
the engine + atomic pointer switch + audit), then the gateway's serving lookup
(``ServingPolicy``) and a 1-token /generate with the new adapter.

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
import os
import queue
import sys
import tempfile
import time
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-url", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--database-url", default="", help="PostgreSQL: also time the notice")
    ap.add_argument(
        "--engine-weights", choices=["float", "int4"], default="float", help="engine --weights"
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
        ids = list(range(100, 140))
        for v in range(1, a.rounds + 1):
            name = f"{pid}-policy-v{v}-{os.getpid()}"
            make_adapter(model_dir, tmp / name, v)
            with transaction(factory) as db:
                db.add(to_row(policy_version(pid, v, id=f"pv{v}", name=name, path=str(tmp / name))))
            t0 = time.perf_counter()  # trainer done
            assert publish_version(factory, settings, f"pv{v}")
            t1 = time.perf_counter()
            serving = ServingPolicy(factory).adapter_for(pid)  # a gateway's fresh lookup
            assert serving == name, serving
            r = httpx.post(
                f"{url}/generate",
                json={
                    "input_ids": ids,
                    "lora_path": serving,
                    "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                },
                timeout=60,
            )
            r.raise_for_status()
            t2 = time.perf_counter()
            seen = ""
            if listener is not None:
                seen = f", notice at a gateway {noticed.get(timeout=10) - t0:.3f} s after the start"
            print(
                f"v{v}: publish (load + switch + unload old) {t1 - t0:.3f} s, "
                f"lookup + first request {t2 - t1:.3f} s, total {t2 - t0:.3f} s{seen} "
                f"(target < 0.1 s)"
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
