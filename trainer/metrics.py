"""Every training metric, named once: :data:`METRICS`. Torch-free (the admin imports it
through trainer/api.py).

A metric is computed either by the loss (``source="loss"``, trainer/loss.py
``ppo_loss``, per micro-batch; :func:`loss_metrics` refuses a set of names that differs from
this table) or by the optimization loop once per step (``source="step"``, trainer/train.py).
From this table derive:

- how a step combines its micro-batches' loss metrics (``reduce``: ``mean`` weighted by
  sampled tokens, ``max``, ``min``; ``weight`` is the token count itself),
- the run summary ``data_stats.run_metrics`` (``summary``: the mean over the run's steps,
  trainer/runner.py ``run_metrics``),
- the dashboard's charts of a run (``chart``, in table order, with ``label``;
  gateway/admin/training_queries.py).

A new loss metric: one row here and its value in ``ppo_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    source: str  # "loss" (ppo_loss, per micro-batch) or "step" (train.py, per step)
    reduce: str = "mean"  # loss metrics: how micro-batches combine (mean, max, min, weight)
    summary: bool = False  # in the run summary (mean over the run's steps)
    chart: bool = False  # charted on the dashboard's run page


METRICS: tuple[Metric, ...] = (
    Metric("loss", "loss", "step", chart=True),
    Metric("reward_mean", "reward mean", "step", chart=True),
    Metric("kl", "KL to the base model", "loss", summary=True, chart=True),
    Metric("kl_prox", "KL to the proximal policy (trust region)", "loss", summary=True, chart=True),
    Metric("entropy", "entropy", "loss", summary=True, chart=True),
    Metric("clip_frac", "clip fraction", "loss", summary=True, chart=True),
    Metric("masked_frac", "masked fraction", "loss", summary=True, chart=True),
    Metric("masked_stale_frac", "masked: stale samples", "loss", summary=True, chart=True),
    Metric(
        "masked_mismatch_frac",
        "masked: engine/trainer mismatch",
        "loss",
        summary=True,
        chart=True,
    ),
    Metric("tokens_per_s", "tokens/s", "step", chart=True),
    Metric("hint_adv_mean", "hint advantage per token (hinted samples)", "step", summary=True),
    Metric(
        "distill_kl", "KL of the hinted teacher to the policy (per token)", "loss", summary=True
    ),
    Metric("dual_clip_frac", "dual-clip fraction", "loss", summary=True),
    Metric("ratio_mean", "ratio pi_theta / pi_prox", "loss"),
    Metric("iw_mean", "behaviour weight pi_prox / mu", "loss"),
    Metric("iw_max", "largest behaviour weight", "loss", reduce="max"),
    Metric("iw_min", "smallest behaviour weight", "loss", reduce="min"),
    Metric("tokens", "sampled tokens", "loss", reduce="weight"),
)

LOSS_METRICS = tuple(m for m in METRICS if m.source == "loss")
MEAN_KEYS = tuple(m.name for m in LOSS_METRICS if m.reduce == "mean")
SUMMARY_KEYS = tuple(m.name for m in METRICS if m.summary)
CHARTS = tuple((m.name, m.label) for m in METRICS if m.chart)


def loss_metrics(**values: float) -> dict[str, float]:
    """The loss's metrics in table order; a name missing from the table, or a table row
    the loss did not compute, is a programming error."""
    names = [m.name for m in LOSS_METRICS]
    if set(values) != set(names):
        raise KeyError(f"loss metrics {sorted(values)} differ from trainer.metrics {names}")
    return {n: values[n] for n in names}


def combine(agg: dict[str, float], values: dict[str, float]) -> None:
    """Fold one micro-batch's loss metrics into a step's running ``agg`` (means as
    token-weighted sums; divide by the step's tokens with :func:`finish`)."""
    weight = values["tokens"]
    for m in LOSS_METRICS:
        v = values[m.name]
        if m.reduce == "max":
            agg[m.name] = max(agg.get(m.name, v), v)
        elif m.reduce == "min":
            agg[m.name] = min(agg.get(m.name, v), v)
        elif m.reduce == "mean":
            agg[m.name] = agg.get(m.name, 0.0) + v * weight


def finish(agg: dict[str, float], num_tokens: float) -> dict[str, float]:
    for name in MEAN_KEYS:
        agg[name] = agg.get(name, 0.0) / max(num_tokens, 1.0)
    return agg
