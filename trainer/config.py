"""Training configuration: every knob is one field of :class:`TrainConfig` (the loss's
are inherited from ``LossConfig`` in trainer/loss.py), declared with ``knob()``
(trainer/knobs.py): its default, its range (``bounds``) or ``choices``, and its help.
Per-project overrides live in ``Project.settings["training"]`` (any field, same name; the
stored format is flat).

Every override is checked before it is stored (admin API) and when a run loads it: the
field's type, its range (:data:`BOUNDS` and :data:`CHOICES` derive from the fields), the
list rules below, the run-size limits, and ``eval_gate``'s own schema
(trainer/eval_gate.py). docs/trainer.md's settings table is :func:`settings_table`'s output
(``python -m trainer.config``; a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.lora import DEFAULT_TARGET_MODULES
from trainer.knobs import bounds_of, choices_of, knob, knob_table
from trainer.loss import LossConfig


class TrainConfigError(ValueError):
    """A training setting that cannot work; the message says what to change."""


MAX_SAMPLE_PASSES = 32_768  # epochs x max_samples: forward/backward passes of one run
MAX_STEP_DELAY_TOTAL_S = 600.0  # step_delay_s x epochs x num_minibatches


# Ranges are generous for real use, small enough that one project cannot tie up the shared
# trainer. Every number knob has ``bounds`` (tests/trainer/test_config_bounds.py checks it).
@dataclass
class TrainConfig(LossConfig):
    """Every training knob: the loss's (inherited from :class:`LossConfig`) and these."""

    # triggers
    schedule_minutes: float = knob(
        30.0, bounds=(0.05, 10_080.0), help="beat: train at most this often (>= 1 sample)"
    )
    threshold: int = knob(
        64, bounds=(1, 100_000), help="train early once this many fresh rated samples wait"
    )
    min_samples: int = knob(1, bounds=(1, 100_000), help="a scheduled run needs at least this many")
    # data
    max_staleness: int = knob(
        2, bounds=(0, 1_000), help="policy versions a sample may lag the serving one"
    )
    max_samples: int = knob(1024, bounds=(1, 8_192), help="samples per run, oldest first")
    group_by_prompt: bool = knob(True, help="same prompt ids are one group (besides group_id)")
    merge_turns: bool = knob(
        True,
        help="forward the turns of a session that extend each other token-exactly as one "
        "sequence (trainer/merge.py); the loss is the same, the forward cheaper",
    )
    # advantages
    std_normalize: bool = knob(True, help="divide a group's advantages by its reward std")
    leave_one_out: bool = knob(False, help="a group's baseline leaves the sample out")
    baseline_alpha: float = knob(
        0.1, bounds=(0.0, 1.0), help="EMA step of the per-task running baseline (singletons)"
    )
    hint_teacher: str = knob(
        "policy",
        choices=("policy", "base"),
        help="who scores a hinted answer (trainer/hints.py): the policy before this run's "
        "update, or the base model (adapter off)",
    )
    # trust region
    kl_prox_target: float | None = knob(
        0.02,
        bounds=(1e-6, 10.0),
        help="stop a run's steps once the next minibatch's KL of pi_prox to pi_theta exceeds "
        "this (null: every step runs)",
    )
    # optimization
    lr: float = knob(
        1e-3, bounds=(0.0, 1.0), help="learning rate (the trust region bounds each run's move)"
    )
    weight_decay: float = knob(0.0, bounds=(0.0, 10.0), help="AdamW weight decay")
    betas: tuple[float, float] = knob(
        (0.9, 0.999), rule="two numbers in [0, 1)", help="AdamW betas"
    )
    max_grad_norm: float = knob(1.0, bounds=(0.0, 10_000.0), help="gradient clipping norm")
    epochs: int = knob(1, bounds=(1, 20), help="passes over a run's samples")
    num_minibatches: int = knob(
        4, bounds=(1, 256), help="optimizer steps per epoch: > 1 so the PPO clip can act"
    )
    micro_batch_tokens: int = knob(
        2048, bounds=(64, 65_536), help="rows x longest sample of one forward (memory bound)"
    )
    seed: int = knob(0, bounds=(0, 2**31 - 1), help="minibatch shuffling seed")
    # LoRA (must fit the engine: rank <= --max-lora-rank, targets in --lora-target-modules)
    lora_rank: int = knob(8, bounds=(1, 256), help="LoRA rank, <= max_lora_rank")
    lora_alpha: float = knob(16.0, bounds=(0.0, 4_096.0), help="LoRA alpha")
    lora_dropout: float = knob(0.0, bounds=(0.0, 0.9), help="LoRA dropout")
    target_modules: list[str] = knob(
        factory=lambda: list(DEFAULT_TARGET_MODULES),
        rule="non-empty subset of the 7 projections",
        help="the projections the adapter trains",
    )
    max_lora_rank: int = knob(64, bounds=(1, 256), help="the engine's --max-lora-rank")
    warm_start: bool = knob(True, help="start from the serving adapter, not a fresh one")
    # runs
    heartbeat_s: float = knob(5.0, bounds=(0.1, 300.0), help="a running run's heartbeat")
    stale_after_s: float = knob(
        120.0,
        bounds=(1.0, 86_400.0),
        help="a 'running' run without a heartbeat this long is taken over",
    )
    step_delay_s: float = knob(
        0.0, bounds=(0.0, 300.0), help="debugging/tests: sleep before each optimizer step"
    )
    # guards on the serving version's own traffic (trainer/guards.py)
    guards: bool = knob(
        True, help="check before every run and on every beat tick; roll back on a trip"
    )
    guard_min_samples: int = knob(
        8, bounds=(2, 10_000), help="rated units (groups / singletons) per version compared"
    )
    guard_alpha: float = knob(
        0.01,
        bounds=(1e-12, 0.49),
        help="one-sided Welch t-test level: is serving worse than the best?",
    )
    guard_reward_margin: float = knob(
        0.1, bounds=(0.0, 2.0), help="... and worse by at least this much (reward scale)"
    )
    guard_window: int = knob(
        10, bounds=(1, 100), help="versions before the serving one that are compared"
    )
    guard_min_diversity: float = knob(
        0.2, bounds=(0.0, 1.0), help="distinct answers / n per group (mean); below: collapse"
    )
    guard_min_entropy: float = knob(
        0.05,
        bounds=(0.0, 20.0),
        help="mean -logprob per sampled token (T > 0); below: collapse",
    )
    guard_max_zero_variance: float = knob(
        0.8, bounds=(0.0, 1.0), help="share of groups with one reward; above: collapse"
    )
    # publishing
    eval_gate: dict[str, Any] = knob(
        factory=dict,
        rule="an object (see Eval gate)",
        help="held-out prompts a candidate must pass (trainer/eval_gate.py)",
    )

    @classmethod
    def from_project_settings(cls, project_settings: dict[str, Any] | None) -> TrainConfig:
        raw = dict((project_settings or {}).get("training") or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise TrainConfigError(f"unknown training settings {unknown}; known: {sorted(known)}")
        for f in fields(cls):
            if f.name in raw:
                _check_type(f.name, raw[f.name], str(f.type))
        if "betas" in raw:
            raw["betas"] = tuple(raw["betas"])
        cfg = cls(**raw)
        cfg.check()
        return cfg

    def check(self) -> None:
        _check_ranges(self)
        if not 0 < self.lora_rank <= self.max_lora_rank:
            raise TrainConfigError(
                f"lora_rank {self.lora_rank} must be in 1..max_lora_rank ({self.max_lora_rank})"
            )
        extra = set(self.target_modules) - set(DEFAULT_TARGET_MODULES)
        if extra or not self.target_modules:
            raise TrainConfigError(
                f"target_modules {sorted(self.target_modules)} must be a non-empty subset of "
                f"{list(DEFAULT_TARGET_MODULES)}"
            )

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self)
        out["betas"] = list(self.betas)
        return out


BOUNDS = bounds_of(TrainConfig)  # each number knob's (min, max), from its field
CHOICES = choices_of(TrainConfig)


def settings_table() -> str:
    """The knob table of docs/trainer.md (``python -m trainer.config`` prints it)."""
    return knob_table(TrainConfig)


def _check_type(name: str, value: Any, annotation: str) -> None:
    """A stored override must have its field's declared type (an int is fine for a float;
    null only for ``| None`` fields)."""
    nullable = annotation.endswith("| None")
    kind_of = annotation.removesuffix("| None").strip()
    if value is None:
        ok, kind = nullable, f"a value ({kind_of})"
    elif kind_of == "bool":
        ok, kind = isinstance(value, bool), "true or false"
    elif kind_of == "int":
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif kind_of == "float":
        ok, kind = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif kind_of == "str":
        ok, kind = isinstance(value, str), "text"
    elif kind_of.startswith("tuple[float"):
        ok = isinstance(value, list | tuple) and len(value) == 2
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        kind = "a list of two numbers"
    elif kind_of == "list[str]":
        ok = isinstance(value, list) and len(value) <= 64
        ok, kind = ok and all(isinstance(v, str) for v in value), "a list of names"
    elif kind_of.startswith("dict["):
        ok, kind = isinstance(value, dict), "an object"
    else:
        ok, kind = False, f"a value of a type the API cannot set ({kind_of})"
    if not ok:
        raise TrainConfigError(f"{name} must be {kind}, not {value!r}")


def _check_ranges(cfg: TrainConfig) -> None:
    """Every bounded field within :data:`BOUNDS`, the choices, ``betas``, the run-size
    limits, and the ``eval_gate`` schema; the message names the setting and its range."""
    from trainer.eval_gate import EvalGate, GateConfigError

    for name, (lo, hi) in BOUNDS.items():
        value = getattr(cfg, name, None)
        if value is not None and not lo <= value <= hi:  # also false for NaN
            raise TrainConfigError(f"{name} must be between {lo:g} and {hi:g}, not {value!r}")
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise TrainConfigError(f"{name} must be one of {list(allowed)}")
    if not all(0 <= b < 1 for b in cfg.betas):
        raise TrainConfigError(f"betas must be two numbers in [0, 1), not {list(cfg.betas)}")
    if cfg.epochs * cfg.max_samples > MAX_SAMPLE_PASSES:
        raise TrainConfigError(
            f"epochs x max_samples must be at most {MAX_SAMPLE_PASSES} "
            f"(now {cfg.epochs} x {cfg.max_samples}); lower one of them"
        )
    delay = cfg.step_delay_s * cfg.epochs * cfg.num_minibatches
    if delay > MAX_STEP_DELAY_TOTAL_S:
        raise TrainConfigError(
            f"step_delay_s x epochs x num_minibatches must be at most "
            f"{MAX_STEP_DELAY_TOTAL_S:g} s (now {delay:g} s); step_delay_s is for debugging"
        )
    try:
        EvalGate.parse(cfg.eval_gate)
    except GateConfigError as e:
        raise TrainConfigError(str(e)) from None


if __name__ == "__main__":
    print(settings_table(), end="")
