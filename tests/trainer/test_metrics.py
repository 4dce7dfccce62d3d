"""Each training metric is named once (trainer/metrics.py): the loss's metrics are exactly
the table's, and the step combination and the run summary derive from it; the table (and
the admin's door, trainer/api.py) import no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from trainer.loss import LossConfig, ppo_loss
from trainer.metrics import LOSS_METRICS, METRICS, SUMMARY_KEYS, combine, finish
from trainer.metrics import loss_metrics as named
from trainer.runner import run_metrics


def test_the_loss_reports_exactly_the_tables_metrics() -> None:
    logp = torch.zeros(2, 3)
    _, m = ppo_loss(logp, logp, logp - 0.1, torch.tensor([1.0, -1.0]), logp == 0, LossConfig())
    assert list(m) == [x.name for x in LOSS_METRICS]
    with pytest.raises(KeyError):
        named(**{**m, "new_metric": 1.0})
    with pytest.raises(KeyError):
        named(**{k: v for k, v in m.items() if k != "kl"})


def test_step_combination_summary_and_charts_derive_from_the_table() -> None:
    logp = torch.zeros(1, 2)
    _, a = ppo_loss(logp, logp, logp, torch.tensor([1.0]), logp == 0, LossConfig())
    _, b = ppo_loss(logp, logp, logp - 1.0, torch.tensor([1.0]), logp == 0, LossConfig())
    agg: dict[str, float] = {}
    combine(agg, a)
    combine(agg, b)
    finish(agg, a["tokens"] + b["tokens"])
    assert agg["iw_max"] == pytest.approx(b["iw_max"]) and agg["iw_min"] == 1.0
    assert agg["iw_mean"] == pytest.approx((a["iw_mean"] + b["iw_mean"]) / 2)
    assert "tokens" not in agg  # the weight, not a step metric
    # a step metric in the summary (computed by train.py) is averaged over the steps too
    steps = [{**agg, "step": 1, "hint_adv_mean": 0.5}, {**agg, "step": 2, "hint_adv_mean": 0.25}]
    summary = run_metrics(steps, 0.0)
    for key in SUMMARY_KEYS:
        want = 0.375 if key == "hint_adv_mean" else agg[key]
        assert summary[key] == pytest.approx(want)
    assert len({m.name for m in METRICS}) == len(METRICS)  # each named once


def test_the_table_and_the_admin_door_import_no_torch() -> None:
    code = "import sys, trainer.metrics, trainer.api; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
