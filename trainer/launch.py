"""Fitting a run's adapter: in this process, or on N processes under torchrun.

:func:`fit` is the one seam between a run's bookkeeping (trainer/runner.py: samples in,
version row out) and its optimization: it loads the policy, trains it (trainer/train.py)
and saves the adapter and its optimizer state into ``inputs.out_dir``. With
``processes > 1`` it writes the run's inputs into a work directory, starts
``python -m torch.distributed.run --standalone --nproc-per-node N -m trainer.launch DIR``
(through ``trainer.launch --exec``: torchrun, and its ranks, die with this process) and
waits: each rank joins the process group (trainer/dist.py), loads the base with its FSDP
shard of every decoder layer, and runs the same loop on its share of every step.
Rank 0 alone writes: each step's metrics as they come (``steps.jsonl``, which this
process relays to ``on_step``: the run's heartbeat), then the adapter into ``out_dir``,
then ``result.json``. The outcome is what one process would return.

A rank that fails (an exception, a kill, out of memory) makes torchrun stop the others
and exit non-zero: :func:`fit` raises :class:`DistributedRunError` with the tail of the
failed rank's log, removes ``out_dir`` (nothing half-written is ever published: the
caller renames ``out_dir`` into place only after a successful fit) and the inputs (they
hold the samples' token ids), and keeps the logs in the work directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.data import Sample

log = logging.getLogger("rlgate.trainer")

INPUTS, STEPS, RESULT, LAUNCH_LOG = "inputs.pkl", "steps.jsonl", "result.json", "torchrun.log"
EXEC = "--exec"
BACKENDS = ("auto", "gloo", "nccl")


class DistributedRunError(RuntimeError):
    """A rank of a multi-process run failed; the message holds its log's tail."""


@dataclass
class FitInputs:
    model_dir: str
    cfg: TrainConfig
    samples: list[Sample]
    out_dir: str  # the adapter, optimizer.pt and trainer_state.json go here
    warm_start: str | None = None
    serving_version: int = 0  # the warm start's version (samples of others count as stale)
    extra: dict[str, Any] = field(default_factory=dict)  # into trainer_state.json


@dataclass
class Fit:
    steps: list[dict[str, Any]]
    warm_started_from: str | None
    hint_gaps: dict[str, float]
    peak_memory_bytes: int = 0  # rank 0's: the GPU's peak allocation, else the peak RSS


def fit(
    inputs: FitInputs,
    *,
    processes: int = 1,
    backend: str = "auto",
    work_dir: Path | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
    poll_s: float = 0.5,
) -> Fit:
    """Train and save ``inputs``' adapter, on ``processes`` processes (module docstring).
    ``work_dir``: for a multi-process run, where its inputs and logs go (required)."""
    if processes <= 1:
        return _fit_here(inputs, on_step=on_step, progress=progress)
    if work_dir is None:
        raise ValueError("a multi-process run needs a work directory")
    return _fit_torchrun(inputs, processes, backend, work_dir, on_step, poll_s)


def _fit_here(
    inputs: FitInputs,
    *,
    dist: Any = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
) -> Fit:
    from trainer.dist import LOCAL
    from trainer.policy import Policy
    from trainer.train import train

    dist = dist or LOCAL
    cfg, warm = inputs.cfg, Path(inputs.warm_start) if inputs.warm_start else None
    policy = Policy.load(Path(inputs.model_dir), cfg, warm, dist)
    opt = policy.make_optimizer(cfg, warm)
    gaps: dict[str, float] = {}
    steps = train(
        policy,
        opt,
        inputs.samples,
        cfg,
        progress=progress,
        on_step=on_step,
        policy_version=inputs.serving_version if policy.warm_started_from else 0,
        hint_gaps=gaps,
        dist=dist,
    )
    if dist.main:
        policy.save(Path(inputs.out_dir), opt, inputs.extra)
    return Fit(steps, policy.warm_started_from, gaps, _peak_memory(policy.device))


def _peak_memory(device: Any) -> int:
    import resource

    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# ---- the parent: start torchrun, relay steps, read the result back ---------------------


def _fit_torchrun(
    inputs: FitInputs,
    processes: int,
    backend: str,
    work_dir: Path,
    on_step: Callable[[dict[str, Any]], None] | None,
    poll_s: float,
) -> Fit:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: use one of {BACKENDS}")
    if work_dir.exists():
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True)
    with open(work_dir / INPUTS, "wb") as f:
        pickle.dump((inputs, backend), f)
    cmd = [
        sys.executable,
        "-m",
        "trainer.launch",
        EXEC,  # torchrun, killed with this process (and the ranks with torchrun)
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        "--max-restarts=0",
        "-m",
        "trainer.launch",
        str(work_dir),
    ]
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    log.info("run on %d processes (%s): %s", processes, backend, work_dir)
    with open(work_dir / LAUNCH_LOG, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    seen = 0
    try:
        while True:
            rc = proc.poll()
            seen = _relay_steps(work_dir / STEPS, seen, on_step)
            if rc is not None:
                break
            time.sleep(poll_s)
    finally:
        if proc.poll() is None:  # we are being stopped: so are the ranks
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        (work_dir / INPUTS).unlink(missing_ok=True)
    result = work_dir / RESULT
    if rc != 0 or not result.is_file():
        shutil.rmtree(inputs.out_dir, ignore_errors=True)
        raise DistributedRunError(
            f"training on {processes} processes failed (torchrun exit {rc}); logs in "
            f"{work_dir}:\n{failure_log(work_dir)}"
        )
    data = json.loads(result.read_text())
    shutil.rmtree(work_dir, ignore_errors=True)
    return Fit(
        data["steps"], data["warm_started_from"], data["hint_gaps"], data["peak_memory_bytes"]
    )


def _relay_steps(path: Path, seen: int, on_step: Callable[[dict[str, Any]], None] | None) -> int:
    """Pass the complete lines of ``steps.jsonl`` after the first ``seen`` to ``on_step``."""
    if not path.is_file():
        return seen
    lines = path.read_text().split("\n")[:-1]  # the last one may be half-written
    for line in lines[seen:]:
        if on_step is not None:
            on_step(json.loads(line))
    return max(seen, len(lines))


def failure_log(work_dir: Path, chars: int = 3000) -> str:
    """The tail of the log of the rank that failed first (one whose log has a traceback,
    else the shortest: a killed rank's stops short), then torchrun's own summary."""
    logs = sorted(work_dir.glob("rank*.log"))
    texts = {p: p.read_text(errors="replace") for p in logs}
    failed = [p for p in logs if "Traceback" in texts[p]] or sorted(
        logs, key=lambda p: len(texts[p])
    )
    parts = [f"--- {p.name}\n{texts[p][-chars:]}" for p in failed[:1]]
    launch = work_dir / LAUNCH_LOG
    if launch.is_file():
        parts.append(f"--- {LAUNCH_LOG}\n{launch.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts)


# ---- a rank ------------------------------------------------------------------------


def _rank_main(work_dir: Path) -> None:
    from trainer.dist import Dist

    rank = int(os.environ["RANK"])
    _die_with_parent()
    fd = os.open(work_dir / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)  # everything the rank prints, its traceback included, goes to its log
    os.dup2(fd, 2)
    (work_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s"
    )
    with open(work_dir / INPUTS, "rb") as f:
        inputs, backend = pickle.load(f)
    dist = Dist.from_env(_backend(backend, int(os.environ["LOCAL_WORLD_SIZE"])))
    try:
        steps_file = work_dir / STEPS

        def write_step(metrics: dict[str, Any]) -> None:
            with open(steps_file, "a") as f:
                f.write(json.dumps(metrics) + "\n")

        done = _fit_here(inputs, dist=dist, on_step=write_step if dist.main else None)
        if dist.main:
            tmp = work_dir / f".{RESULT}"
            tmp.write_text(json.dumps(vars(done)))
            tmp.rename(work_dir / RESULT)
        dist.barrier()
    finally:
        dist.close()


def _backend(backend: str, local_world: int) -> str:
    """``auto``: NCCL when each local rank has a GPU of its own, else gloo (NCCL does not
    run two ranks on one GPU)."""
    if backend != "auto":
        return backend
    import torch

    return (
        "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"
    )


def _die_with_parent() -> None:
    """Be killed when the parent process dies (Linux; elsewhere nothing): a worker killed
    mid-run takes its torchrun with it, and torchrun its ranks, so no orphan keeps the
    GPU (the run itself is failed by the next claimer's takeover, trainer/runs.py)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    if sys.argv[1] == EXEC:
        _die_with_parent()  # kept across exec
        os.execv(sys.argv[2], sys.argv[2:])
    _rank_main(Path(sys.argv[1]))
