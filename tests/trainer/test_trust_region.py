"""The trust region and the new loss terms: the KL bound stops a run's steps, the masked
fraction splits into stale and engine/trainer mismatch, the entropy bonus and its floor."""

from __future__ import annotations

import random

import pytest
import torch

from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from tests.servers import MODEL_CACHE
from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.loss import LossConfig, ppo_loss
from trainer.policy import Policy


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 3, generator=g) - 0.1
    behav = logp.clone()
    behav[0] -= 2.0  # row 0: pi_prox / mu = e^2 > band_high: masked
    behav[1, 0] -= 2.0  # row 1: one token masked
    return logp, behav, torch.tensor([1.0, -1.0]), torch.ones(2, 3, dtype=torch.bool)


def test_masked_fraction_splits_into_stale_and_mismatch() -> None:
    logp, behav, adv, mask = _inputs()
    cfg = LossConfig()
    _, m = ppo_loss(logp, logp, behav, adv, mask, cfg, stale=torch.tensor([True, False]))
    assert m["masked_frac"] == pytest.approx(4 / 6)
    assert m["masked_stale_frac"] == pytest.approx(3 / 6)  # row 0 came from another version
    assert m["masked_mismatch_frac"] == pytest.approx(1 / 6)
    assert m["kl_prox"] == 0.0  # pi_theta == pi_prox


def test_entropy_bonus_and_floor() -> None:
    logp, behav, adv, mask = _inputs()
    ent = torch.full((2, 3), 0.5, requires_grad=True)
    base, _ = ppo_loss(logp, logp, logp, adv, mask, LossConfig())
    bonus, m = ppo_loss(logp, logp, logp, adv, mask, LossConfig(entropy_coef=0.1), entropy=ent)
    assert m["entropy"] == pytest.approx(0.5)
    assert float(bonus.detach()) == pytest.approx(float(base) - 0.1 * 0.5)
    bonus.backward()
    assert ent.grad is not None and bool((ent.grad < 0).all())  # more entropy, less loss
    floored, _ = ppo_loss(
        logp, logp, logp, adv, mask, LossConfig(entropy_coef=0.1, entropy_floor=0.4), entropy=ent
    )
    assert float(floored.detach()) == pytest.approx(float(base))  # above the floor: no bonus


def test_kl_bound_stops_the_run_before_a_step_that_would_move_too_far() -> None:
    from trainer.train import train

    rng = random.Random(1)
    samples = []
    for i in range(8):
        prompt = [rng.randrange(100, 40000) for _ in range(12)]
        c = [rng.randrange(100, 40000) for _ in range(4)]
        samples.append(Sample(f"s{i}", prompt, c, [-3.0] * 4, 1.0, 0.0, f"g{i}", "t", (-1.0) ** i))
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    steps_taken = {}
    for target in (None, 1e-4):
        cfg = TrainConfig(
            lora_rank=4,
            lr=5e-2,
            num_minibatches=4,
            kl_coef=0.02,
            kl_prox_target=target,
            band_low=None,
            band_high=None,
            behav_weight_cap=None,
            micro_batch_tokens=10**6,
        )
        policy = Policy.load(model_dir, cfg)
        steps = train(policy, policy.make_optimizer(cfg, None), samples, cfg, progress=False)
        steps_taken[target] = steps
    free, bounded = steps_taken[None], steps_taken[1e-4]
    assert len(free) == 4 and not any(s.get("stopped_early") for s in free)
    assert free[1]["kl_prox"] > 1e-4  # after one step at this lr the policy has moved
    assert len(bounded) == 1 and bounded[0]["stopped_early"]
    assert bounded[0]["stop_kl_prox"] > 1e-4
    assert all(s["entropy"] > 0 and s["kl"] >= 0 for s in free)
