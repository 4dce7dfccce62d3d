"""Training configuration: defaults here, per-project overrides in
``Project.settings["training"]`` (any field below, same name).

Every override is checked before it is stored (admin API) and when a run loads it: the
field's type, its range in :data:`BOUNDS` (every number field has one), the choices and
lists below, the run-size limits, and ``eval_gate``'s own schema (trainer/eval_gate.py).
docs/trainer.md has the table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.lora import DEFAULT_TARGET_MODULES
from trainer.loss import LossConfig


class TrainConfigError(ValueError):
    """A training setting that cannot work; the message says what to change."""


# Allowed range of every number field, (min, max) inclusive; a null is allowed only where
# the field's type says ``| None``. Generous for real use, small enough that one project
# cannot tie up the shared trainer. A new number field needs an entry here
# (tests/trainer/test_config_bounds.py checks it).
BOUNDS: dict[str, tuple[float, float]] = {
    "schedule_minutes": (0.05, 10_080.0),  # 3 s .. one week
    "threshold": (1, 100_000),
    "min_samples": (1, 100_000),
    "max_staleness": (0, 1_000),
    "max_samples": (1, 8_192),
    "baseline_alpha": (0.0, 1.0),
    "eps_low": (0.0, 1.0),
    "eps_high": (0.0, 10.0),
    "behav_weight_cap": (1.0, 10_000.0),
    "band_low": (0.0, 1.0),
    "band_high": (1.0, 10_000.0),
    "kl_coef": (0.0, 10.0),
    "entropy_coef": (0.0, 10.0),
    "entropy_floor": (0.0, 20.0),  # nats; ln(vocab) is ~11 for a 49k vocabulary
    "kl_prox_target": (1e-6, 10.0),
    "lr": (0.0, 1.0),
    "weight_decay": (0.0, 10.0),
    "max_grad_norm": (0.0, 10_000.0),
    "epochs": (1, 20),
    "num_minibatches": (1, 256),
    "micro_batch_tokens": (64, 65_536),
    "seed": (0, 2**31 - 1),
    "lora_rank": (1, 256),
    "lora_alpha": (0.0, 4_096.0),
    "lora_dropout": (0.0, 0.9),
    "max_lora_rank": (1, 256),
    "heartbeat_s": (0.1, 300.0),
    "stale_after_s": (1.0, 86_400.0),
    "step_delay_s": (0.0, 300.0),
    "guard_min_samples": (2, 10_000),
    "guard_alpha": (1e-12, 0.49),
    "guard_reward_margin": (0.0, 2.0),
    "guard_window": (1, 100),
    "guard_min_diversity": (0.0, 1.0),
    "guard_min_entropy": (0.0, 20.0),
    "guard_max_zero_variance": (0.0, 1.0),
}
CHOICES: dict[str, tuple[str, ...]] = {"aggregation": ("token-mean", "seq-mean")}
MAX_SAMPLE_PASSES = 32_768  # epochs x max_samples: forward/backward passes of one run
MAX_STEP_DELAY_TOTAL_S = 600.0  # step_delay_s x epochs x num_minibatches


@dataclass
class TrainConfig:
    # triggers
    schedule_minutes: float = 30.0  # beat: train at most this often (>= 1 sample)
    threshold: int = 64  # train early once this many fresh rated samples wait
    min_samples: int = 1  # a scheduled run needs at least this many
    # data
    max_staleness: int = 2  # policy versions a sample may lag the serving one
    max_samples: int = 1024  # per run, oldest first
    group_by_prompt: bool = True  # same prompt ids = one group (besides group_id)
    # forward the turns of a session that extend each other token-exactly as one sequence
    # (trainer/merge.py); the loss is the same either way, only the forward is cheaper
    merge_turns: bool = True
    # advantages
    std_normalize: bool = True
    leave_one_out: bool = False
    baseline_alpha: float = 0.1  # EMA step of the per-task running baseline
    # loss
    eps_low: float = 0.2
    eps_high: float = 0.28
    behav_weight_cap: float | None = 5.0
    band_low: float | None = 0.5
    band_high: float | None = 2.0
    kl_coef: float = 0.02  # k3 KL to the base model (adapter off): keeps the policy near it
    entropy_coef: float = 0.0  # entropy bonus (full-distribution entropy at sampled positions)
    entropy_floor: float | None = None  # with entropy_coef: the bonus acts only below this
    aggregation: str = "token-mean"
    # trust region: stop a run's optimizer steps once the approximate KL(pi_prox || pi_theta)
    # of the next minibatch exceeds this (None: every step runs)
    kl_prox_target: float | None = 0.02
    # optimization
    lr: float = 1e-4  # LoRA (typical 1e-4..2e-4); the trust region bounds each run's move
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    epochs: int = 1
    num_minibatches: int = 4  # optimizer steps per epoch: > 1 so the PPO clip can act
    micro_batch_tokens: int = 2048  # rows x longest sample of one forward (memory bound)
    seed: int = 0
    # LoRA (must fit the engine: rank <= --max-lora-rank, targets in --lora-target-modules)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    max_lora_rank: int = 64
    warm_start: bool = True
    # runs
    heartbeat_s: float = 5.0
    stale_after_s: float = 120.0  # a 'running' run without heartbeat this long is taken over
    step_delay_s: float = 0.0  # debugging/tests: sleep before each optimizer step
    # guards on the serving version's own traffic (trainer/guards.py)
    guards: bool = True  # check before every run and on every beat tick; roll back on a trip
    guard_min_samples: int = 8  # rated units (groups / singletons) per version compared
    guard_alpha: float = 0.01  # one-sided Welch t-test level: serving worse than the best?
    guard_reward_margin: float = 0.1  # ... and worse by at least this much (reward scale)
    guard_window: int = 10  # how many versions before the serving one are compared
    guard_min_diversity: float = 0.2  # distinct answers / n per group (mean), below = collapse
    guard_min_entropy: float = 0.05  # mean -logprob per sampled token (T > 0), below = collapse
    guard_max_zero_variance: float = 0.8  # share of groups with one reward, above = collapse
    # publishing
    eval_gate: dict[str, Any] = field(default_factory=dict)  # trainer/eval_gate.py

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
        if self.aggregation not in ("token-mean", "seq-mean"):
            raise TrainConfigError("aggregation must be token-mean or seq-mean")
        if self.max_staleness < 0 or self.epochs < 1 or self.num_minibatches < 1:
            raise TrainConfigError("max_staleness >= 0, epochs >= 1, num_minibatches >= 1")

    def loss_config(self) -> LossConfig:
        return LossConfig(
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            behav_weight_cap=self.behav_weight_cap,
            band_low=self.band_low,
            band_high=self.band_high,
            kl_coef=self.kl_coef,
            entropy_coef=self.entropy_coef,
            entropy_floor=self.entropy_floor,
            aggregation=self.aggregation,
        )

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self)
        out["betas"] = list(self.betas)
        return out


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
