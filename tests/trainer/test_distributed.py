"""A run on 2 processes (torchrun, gloo, FSDP2 over the packaged model's decoder layers)
against the same run in one process: the same adapter within a stated tolerance, the
same metrics, and a killed rank that fails the run with nothing left to publish."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from tests.servers import MODEL_CACHE
from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.launch import DistributedRunError, FitInputs, fit

# The tolerance. fp32 on the CPU: the ranks sum the gradient in another order and forward
# plain rows where one process shares prompts, so the first step's numbers differ in their
# last bits (~1e-6 relative). AdamW's first steps move an entry by about lr x sign(g),
# which flips where g is ~0 (lora_A's gradient is exactly 0 at the first step, B being 0,
# and tiny at the second): an entry may differ by up to 2 x lr, the adapter as a whole by
# a fraction of a percent (measured: 0.4 % of what the run moved), and the metrics of
# the steps after the first by what that moves (measured: 4e-4 relative on kl).
ADAPTER_MAX_ABS = 2.5e-3  # 2 x lr (1e-3) and a margin
ADAPTER_REL_NORM = 1e-2  # ||a2 - a1|| / ||a1 - a0||: at most 1 % of what the run moved
FIRST_STEP_RTOL = 1e-5  # the same adapter, summed in another order
LATER_STEP_RTOL = 3e-3  # after an update that may differ as above


def _samples() -> list[Sample]:
    """A group of three answers (one shared prompt) and three singletons."""
    rng = random.Random(11)
    out = []
    for g in range(4):
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(6, 18))]
        for i in range(3 if g < 1 else 1):
            c = rng.randint(2, 8)
            out.append(
                Sample(
                    f"g{g}s{i}",
                    prompt,
                    [rng.randrange(100, 40000) for _ in range(c)],
                    [rng.uniform(-3.0, -0.5) for _ in range(c)],
                    0.8,
                    float(i % 2),
                    f"g{g}",
                    "t",
                    advantage=(-1.0) ** (g + i),
                )
            )
    return out


def _cfg(**over: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "lora_rank": 4,
        "lr": 1e-3,
        "num_minibatches": 2,
        "epochs": 1,
        "micro_batch_tokens": 40,  # several micro-batches a step, unevenly many per rank
        "band_low": None,
        "band_high": None,
        "kl_prox_target": None,
    }
    return TrainConfig(**{**values, **over})


def _inputs(tmp: Path, name: str, cfg: TrainConfig) -> FitInputs:
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    return FitInputs(str(model_dir), cfg, _samples(), str(tmp / name), extra={"version": 1})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("dist")
    cfg = _cfg()
    one = fit(_inputs(tmp, "one", cfg))
    relayed: list[dict[str, Any]] = []
    two = fit(
        _inputs(tmp, "two", cfg),
        processes=2,
        backend="gloo",
        work_dir=tmp / "work",
        on_step=relayed.append,
        poll_s=0.2,
    )
    return {"tmp": tmp, "one": one, "two": two, "relayed": relayed}


def test_two_ranks_train_the_adapter_one_process_trains(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    a1 = load_file(tmp / "one" / "adapter_model.safetensors")
    a2 = load_file(tmp / "two" / "adapter_model.safetensors")
    assert sorted(a1) == sorted(a2) and a1
    diff = max(float((a1[k] - a2[k]).abs().max()) for k in a1)
    assert diff <= ADAPTER_MAX_ABS, diff
    # lora_B starts at zero, so what the run moved is B itself (A is its random start)
    moved = sum(float(a1[k].pow(2).sum()) for k in a1 if "lora_B" in k) ** 0.5
    gap = sum(float((a1[k] - a2[k]).pow(2).sum()) for k in a1) ** 0.5
    assert moved > 0 and gap / moved <= ADAPTER_REL_NORM, (gap, moved)
    # the optimizer state and the trainer state are the one-process run's, same layout
    s1 = json.loads((tmp / "one" / "trainer_state.json").read_text())
    s2 = json.loads((tmp / "two" / "trainer_state.json").read_text())
    assert s1 == s2
    o1 = torch.load(tmp / "one" / "optimizer.pt", weights_only=True)
    o2 = torch.load(tmp / "two" / "optimizer.pt", weights_only=True)
    assert o1["param_groups"] == o2["param_groups"]
    assert sorted(o1["state"]) == sorted(o2["state"])
    for k, st in o1["state"].items():
        assert int(st["step"]) == int(o2["state"][k]["step"]) == 2
        torch.testing.assert_close(st["exp_avg"], o2["state"][k]["exp_avg"], atol=1e-6, rtol=1e-3)
    assert not (tmp / "work").exists()  # a run that worked leaves no work directory


# what the steps cost, not what they learn: the ranks forward other micro-batches
ACCOUNTING = {"seconds", "tokens_per_s", "micro_batches", "batch_tokens"}
ACCOUNTING |= {"forward_tokens", "forward_tokens_saved", "merged_turns"}
ACCOUNTING |= {"no_grad_forward_tokens", "no_grad_forward_tokens_saved"}


def test_two_ranks_report_the_metrics_of_one_process(runs: dict[str, Any]) -> None:
    one, two = runs["one"], runs["two"]
    assert len(one.steps) == len(two.steps) == 2
    assert runs["relayed"] == two.steps  # rank 0's steps reached on_step as they came
    for s1, s2 in zip(one.steps, two.steps, strict=True):
        assert set(s1) == set(s2)
        rtol = FIRST_STEP_RTOL if s1["step"] == 1 else LATER_STEP_RTOL
        for key in sorted(set(s1) - ACCOUNTING):
            v1, v2 = s1[key], s2[key]
            if isinstance(v1, float):
                assert v2 == pytest.approx(v1, rel=rtol, abs=1e-9), key
            else:
                assert v1 == v2, key
        assert s1["batch_tokens"] == s2["batch_tokens"]  # every rank's tokens counted
    assert one.warm_started_from is two.warm_started_from is None


def test_a_killed_rank_fails_the_run_and_leaves_no_adapter(tmp_path: Path) -> None:
    cfg = _cfg(num_minibatches=3, step_delay_s=2.0)
    inputs = _inputs(tmp_path, "out", cfg)
    work = tmp_path / "work"
    killed: list[int] = []

    def kill_rank_1(_: dict[str, Any]) -> None:  # after the first step, mid-run
        if not killed:
            killed.append(int((work / "rank1.pid").read_text()))
            os.kill(killed[0], signal.SIGKILL)

    with pytest.raises(DistributedRunError) as err:
        fit(inputs, processes=2, backend="gloo", work_dir=work, on_step=kill_rank_1, poll_s=0.2)
    assert killed
    assert not Path(inputs.out_dir).exists()  # nothing to rename into place, or publish
    assert "rank1.log" in str(err.value) or "rank0.log" in str(err.value)
    assert "torchrun.log" in str(err.value)
    assert not (work / "inputs.pkl").exists()  # the samples' tokens do not stay behind
    assert (work / "rank0.log").is_file() and (work / "rank1.log").is_file()


def test_each_step_deals_its_rows_to_the_ranks_by_tokens() -> None:
    """Pure bookkeeping, no process group: every rank computes every rank's share."""
    from trainer.dist import Dist, split_even
    from trainer.train import rank_micro_batches

    assert split_even([5, 1, 1, 1, 4], 2) == [[0, 2], [1, 3, 4]]  # loads 6 and 6
    assert split_even([3], 2) == [[0], []]
    batch = _samples()
    cfg = _cfg()
    shares = [rank_micro_batches(batch, cfg, Dist(r, 2)) for r in range(2)]
    everything, _, rounds = shares[0]
    assert [b.samples for b in everything] == [b.samples for b in shares[1][0]]
    mine = [[s.interaction_id for b in share[1] for s in b.samples] for share in shares]
    assert sorted(mine[0] + mine[1]) == sorted(s.interaction_id for s in batch)
    assert not set(mine[0]) & set(mine[1])
    assert rounds == max(len(share[1]) for share in shares) == shares[1][2]
    one, mine_one, rounds_one = rank_micro_batches(batch, cfg)
    assert mine_one is one and rounds_one == len(one)  # one process: as before


def test_the_failure_log_is_the_failed_ranks(tmp_path: Path) -> None:
    from trainer.launch import failure_log

    (tmp_path / "rank0.log").write_text("step 1\nstep 2\nRuntimeError: gloo connection closed\n")
    (tmp_path / "rank1.log").write_text("step 1\nTraceback (most recent call last):\nOOM\n")
    (tmp_path / "torchrun.log").write_text("ChildFailedError: rank 1 exited with 1\n")
    text = failure_log(tmp_path)
    assert "--- rank1.log" in text and "OOM" in text and "rank0.log" not in text
    assert "ChildFailedError" in text
