"""Scale check (scripts/device_check.sh --scale [--dry]): training beyond one process and
one GPU shared with SGLang, in under 10 minutes on one GPU. Steps, each with its time
and memory:

1. ``fsdp``: the same run in one process and on 2 processes (trainer/launch.py: torchrun,
   FSDP2; on one GPU the two ranks share it, so the backend is gloo); the two adapters
   must agree (relative gap to what the run moved, bfloat16 on the GPU);
2. ``sglang``: real SGLang with LoRA and ``--enable-memory-saver`` on the GPU
   (RLGATE_DEVICE_SGLANG_PYTHON, else python3), a greedy base answer;
3. ``release``: trainer/shared_gpu.py around a one-process run on the same GPU: the
   device's free memory before, while released, and after the resume;
4. ``publish``: the run's adapter loaded into SGLang and the next call served by it
   (its logprobs differ from the base's).

The model is the packaged SmolLM2-135M's architecture with random, seeded weights and the
packaged tokenizer (``.device-tokenizer/``; device_check_common.build_model_dir).
``--dry`` runs the same steps on the CPU, on the tiny model: the embedded engine stands in
for SGLang and the release is skipped (it has no GPU memory); CI can run it.
Prints one line per step and PASS/FAIL lines; exits 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import resource
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from device_check_common import build_model_dir  # noqa: E402

FSDP_REL_GAP = {"cpu": 0.01, "cuda": 0.05}  # ||a2 - a1|| / ||a1 moved||; bf16 on a GPU
PROMPT = [1, 42, 198, 283, 359, 253, 556, 564, 11, 2]  # ids below the tiny vocabulary


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def step(self, name: str, seconds: float, memory: str) -> None:
        print(f"STEP {name}: {seconds:.1f} s, {memory}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            self.failed.append(name)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def device_memory() -> str:
    import torch

    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return f"GPU used {_gib(total - free)} of {_gib(total)}"
    return f"peak RSS {_gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}"


def samples(n: int, seed: int, vocab: int) -> list[Any]:
    from trainer.data import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(8, 40))]
        c = rng.randint(4, 16)
        out.append(
            Sample(
                f"s{i}",
                prompt,
                [rng.randrange(100, vocab) for _ in range(c)],
                [rng.uniform(-3.0, -0.5) for _ in range(c)],
                1.0,
                float(i % 2),
                f"g{i}",
                "t",
                advantage=(-1.0) ** i,
            )
        )
    return out


def fit_once(model: Path, out: Path, processes: int, work: Path) -> Any:
    import json

    from trainer.config import TrainConfig
    from trainer.launch import FitInputs, fit

    cfg = TrainConfig(
        lora_rank=8,
        lr=1e-3,
        num_minibatches=2,
        micro_batch_tokens=256,
        band_low=None,
        band_high=None,
        kl_prox_target=None,
    )
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    batch = samples(16, 3, vocab)
    inputs = FitInputs(str(model), cfg, batch, str(out), extra={"version": 1})
    return fit(inputs, processes=processes, backend="auto", work_dir=work, poll_s=0.2)


def adapter_gap(a: Path, b: Path) -> tuple[float, float]:
    from safetensors.torch import load_file

    x, y = load_file(a / "adapter_model.safetensors"), load_file(b / "adapter_model.safetensors")
    moved = sum(float(x[k].float().pow(2).sum()) for k in x if "lora_B" in k) ** 0.5
    gap = sum(float((x[k].float() - y[k].float()).pow(2).sum()) for k in x) ** 0.5
    return gap, moved


@contextmanager
def engine(dry: bool, model: Path, log: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """SGLang on the GPU (``--enable-memory-saver``), or with ``dry`` the embedded one."""
    if dry:
        from tests.servers import engine_cmd, free_port, running

        port = free_port()
        key = secrets.token_urlsafe(16)
        cmd = engine_cmd(port, "--model", str(model), "--max-lora-rank", "16")
        cmd += ["--context-length", "512", "--max-running-requests", "4"]
        with running(cmd, {"RLGATE_ENGINE_API_KEY": key}, log, port) as p:
            yield p.url, {"Authorization": f"Bearer {key}"}
        return
    from tests.sglang import sglang_server

    os.environ.setdefault(
        "RLGATE_TEST_SGLANG_PYTHON", os.environ.get("RLGATE_DEVICE_SGLANG_PYTHON", "python3")
    )
    os.environ["RLGATE_TEST_SGLANG_DEVICE"] = "gpu"
    os.environ["RLGATE_TEST_SGLANG_MODEL"] = str(model)
    extra = ("--enable-memory-saver", "--mem-fraction-static", "0.5", "--max-total-tokens", "8192")
    with sglang_server(log, *extra) as s:
        yield s.url, s.headers


def greedy(url: str, headers: dict[str, str], adapter: str | None) -> list[float]:
    import httpx

    from core import engine_protocol as proto

    sampling = proto.Sampling(max_new_tokens=8, values=proto.GREEDY)
    body = proto.generate_body(PROMPT, sampling, adapter=adapter)
    r = httpx.post(url + proto.GENERATE, json=body, headers=headers, timeout=120)
    r.raise_for_status()
    return [x[0] for x in r.json()["meta_info"]["output_token_logprobs"]]


def timed(report: Report, name: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    value = fn()
    report.step(name, time.monotonic() - started, device_memory())
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="CPU, tiny model, embedded engine")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    import torch

    dev = "cuda" if torch.cuda.is_available() and not args.dry else "cpu"
    if dev == "cpu" and not args.dry:
        print("no GPU: run with --dry (CPU), or on a GPU machine")
        return 2
    if args.dry:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the ranks too
    tmp = Path(tempfile.mkdtemp(prefix="rlgate-scale-"))
    report = Report()
    try:
        model = tmp / "model"
        build_model_dir(model, tiny=args.dry, seed=0)
        tok = REPO / ".device-tokenizer"
        if args.dry and not (tok / "tokenizer.json").is_file():
            from engine.model_files import PACKAGED_MODEL, resolve_model_dir
            from tests.servers import MODEL_CACHE

            tok = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (tok / f).is_file():
                shutil.copy2(tok / f, model / f)
        print(f"scale check on {dev} ({'dry, tiny model' if args.dry else 'SmolLM2-135M shape'})")

        # 1. the same run on one process and on two
        one = timed(report, "fsdp: 1 process", lambda: fit_once(model, tmp / "a1", 1, tmp / "w1"))
        report.step("fsdp: 1 process peak", 0.0, _gib(one.peak_memory_bytes))
        two = timed(report, "fsdp: 2 processes", lambda: fit_once(model, tmp / "a2", 2, tmp / "w2"))
        report.step("fsdp: 2 processes, rank 0 peak", 0.0, _gib(two.peak_memory_bytes))
        gap, moved = adapter_gap(tmp / "a1", tmp / "a2")
        limit = FSDP_REL_GAP[dev]
        report.check(
            "fsdp adapter = one process",
            moved > 0 and gap / moved <= limit,
            f"gap {gap:.3g} / moved {moved:.3g} (limit {limit})",
        )
        l1, l2 = one.steps[0]["loss"], two.steps[0]["loss"]
        report.check(
            "fsdp metrics = one process",
            math.isclose(l1, l2, rel_tol=1e-2, abs_tol=1e-6),
            f"first step's loss {l1:.6g} vs {l2:.6g}",
        )

        # 2.-4. the engine, its memory around a run on the same GPU, the publish
        with engine(args.dry, model, tmp / "engine.log") as (url, headers):
            base = timed(report, "engine: base answer", lambda: greedy(url, headers, None))
            from core.engine_http import EngineHTTP
            from core.settings import Settings
            from trainer.shared_gpu import engines_released

            key = headers["Authorization"].split(" ", 1)[1]
            settings = Settings(
                engine_urls=url,
                engine_api_key=key,
                train_shared_gpu_engines="" if args.dry else url,
            )
            if args.dry:
                print("SKIP release: the embedded engine has no GPU memory to release")
            started = time.monotonic()
            with engines_released(settings):
                during = device_memory()
                fit_once(model, tmp / "v1", 1, tmp / "w3")
            report.step("release: train while released", time.monotonic() - started, during)
            report.step("release: resumed", 0.0, device_memory())
            name = "scale-check-v1"

            def publish() -> tuple[bool, str]:
                with EngineHTTP(url, headers) as e:
                    return e.load(name, str(tmp / "v1"))

            ok, message = timed(report, "publish: load", publish)
            report.check("publish: loaded", ok, message or "ok")
            new = timed(report, "publish: served", lambda: greedy(url, headers, name))
            report.check(
                "publish: the next call is served by the new version",
                new != base,
                f"logprobs {new[:3]} vs base {base[:3]}",
            )
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"SUMMARY: {'all passed' if not report.failed else 'FAILED: ' + ', '.join(report.failed)}"
    )
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
