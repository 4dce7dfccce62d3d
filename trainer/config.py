"""Training configuration: defaults here, per-project overrides in
``Project.settings["training"]`` (any field below, same name)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.lora import DEFAULT_TARGET_MODULES
from trainer.loss import LossConfig


class TrainConfigError(ValueError):
    """A training setting that cannot work; the message says what to change."""


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
    kl_coef: float = 0.0
    aggregation: str = "token-mean"
    # optimization
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    epochs: int = 1
    num_minibatches: int = 1  # optimizer steps per epoch
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
    # publishing
    eval_gate: dict[str, Any] = field(default_factory=dict)  # see trainer/publish.py

    @classmethod
    def from_project_settings(cls, project_settings: dict[str, Any] | None) -> TrainConfig:
        raw = dict((project_settings or {}).get("training") or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise TrainConfigError(f"unknown training settings {unknown}; known: {sorted(known)}")
        defaults = cls()
        for f in fields(cls):
            if f.name in raw:
                _check_type(f.name, raw[f.name], getattr(defaults, f.name), "None" in str(f.type))
        if "betas" in raw:
            raw["betas"] = tuple(raw["betas"])
        cfg = cls(**raw)
        cfg.check()
        return cfg

    def check(self) -> None:
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
            aggregation=self.aggregation,
        )

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self)
        out["betas"] = list(self.betas)
        return out


def _check_type(name: str, value: Any, default: Any, nullable: bool) -> None:
    """A stored override must have its field's type (an int is fine for a float)."""
    if value is None and nullable:
        return
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(default, (list, tuple)):
        ok, kind = isinstance(value, (list, tuple)), "a list"
    else:
        ok, kind = isinstance(value, type(default)), type(default).__name__
    if not ok:
        raise TrainConfigError(f"{name} must be {kind}, not {value!r}")
