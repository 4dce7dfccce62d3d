"""The decoupled PPO loss against hand-computed values (small tensors, pure torch)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import LossConfig, ppo_loss, token_logprobs

NO_IW = LossConfig(behav_weight_cap=None, band_low=None, band_high=None, kl_coef=0.0)
L = math.log


def t(*rows):  # type: ignore[no-untyped-def]
    return torch.tensor(rows, dtype=torch.float64)


def one(logp, prox=0.0, behav=0.0, adv=1.0, cfg=NO_IW, **kw):  # type: ignore[no-untyped-def]
    lp = t([logp]).requires_grad_(True)
    loss, m = ppo_loss(
        lp, t([prox]), t([behav]), t(adv), torch.ones(1, 1, dtype=torch.bool), cfg, **kw
    )
    return loss, m, lp


def test_temperature_scaling() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    got = token_logprobs(logits, torch.tensor([2, 0]), torch.tensor([2.0, 0.0]))
    z = math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5))
    assert got[0].item() == pytest.approx(1.5 - z, abs=1e-6)  # log_softmax(z / 2)
    z1 = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    assert got[1].item() == pytest.approx(1.0 - z1, abs=1e-6)  # T = 0 -> T = 1


def test_ratio_inside_the_clip_range() -> None:
    loss, m, lp = one(L(1.1), adv=2.0)
    assert loss.item() == pytest.approx(-2.2)
    assert m["clip_frac"] == 0 and m["ratio_mean"] == pytest.approx(1.1)
    loss.backward()
    assert lp.grad.item() == pytest.approx(-2.2)  # d(-A r)/d logp = -A r


def test_clip_high_and_low() -> None:
    # A > 0, ratio 1.5 > 1 + eps_high (1.28): the clipped term wins, no gradient
    loss, m, lp = one(L(1.5), adv=1.0)
    assert loss.item() == pytest.approx(-1.28) and m["clip_frac"] == 1.0
    loss.backward()
    assert lp.grad.item() == 0.0
    # A < 0, ratio 0.5 < 1 - eps_low (0.8): clipped term -A * 0.8 = 0.8 wins
    loss, m, _ = one(L(0.5), adv=-1.0)
    assert loss.item() == pytest.approx(0.8) and m["clip_frac"] == 1.0
    # A > 0, ratio 0.5: pessimistic bound keeps the unclipped -0.5
    loss, m, _ = one(L(0.5), adv=1.0)
    assert loss.item() == pytest.approx(-0.5) and m["clip_frac"] == 0.0
    # A < 0, ratio 1.5: unclipped -A * 1.5 = 1.5 wins
    loss, m, _ = one(L(1.5), adv=-1.0)
    assert loss.item() == pytest.approx(1.5) and m["clip_frac"] == 0.0


def test_ratio_is_against_the_proximal_policy() -> None:
    # current == proximal (ratio 1) although behaviour differs: weight w = e^(prox - behav)
    loss, m, _ = one(L(0.3), prox=L(0.3), behav=L(0.2), adv=1.0)
    assert loss.item() == pytest.approx(-1.5)  # w = 0.3 / 0.2 = 1.5, ratio 1
    assert m["iw_mean"] == pytest.approx(1.5) and m["ratio_mean"] == pytest.approx(1.0)


def test_behaviour_weight_truncation() -> None:
    cfg = LossConfig(behav_weight_cap=2.0, band_low=None, band_high=None)
    loss, m, lp = one(0.0, prox=0.0, behav=-L(3.0), adv=1.0, cfg=cfg)  # w = 3 -> 2
    assert loss.item() == pytest.approx(-2.0)
    assert m["iw_max"] == pytest.approx(3.0) and m["masked_frac"] == 0.0
    loss.backward()
    assert lp.grad.item() == pytest.approx(-2.0)


def test_band_masks_tokens_and_keeps_the_denominator() -> None:
    cfg = LossConfig(behav_weight_cap=None, band_low=0.5, band_high=2.0)
    # token 0: w = 3 (above), token 1: w = 1, token 2: w = 0.25 (below)
    logp = t([0.0, 0.0, 0.0]).requires_grad_(True)
    behav = t([-L(3.0), 0.0, L(4.0)])
    loss, m = ppo_loss(logp, t([0.0, 0.0, 0.0]), behav, t(1.0), torch.ones(1, 3).bool(), cfg)
    assert loss.item() == pytest.approx(-1.0 / 3)  # only token 1 counts, divided by 3
    assert m["masked_frac"] == pytest.approx(2 / 3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1 / 3, 0.0])


def test_aggregation_modes_and_padding() -> None:
    # seq 0: one token with ratio 1.1; seq 1: three tokens, ratio 1 (padding in row 0)
    logp = torch.tensor([[L(1.1), 9.0, 9.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    zeros = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]]).bool()
    adv = t(1.0, 2.0)
    tok, _ = ppo_loss(logp, zeros, zeros, adv, mask, NO_IW)
    assert tok.item() == pytest.approx((-1.1 - 2 - 2 - 2) / 4)
    seq_cfg = LossConfig(
        behav_weight_cap=None, band_low=None, band_high=None, aggregation="seq-mean"
    )
    seq, _ = ppo_loss(logp, zeros, zeros, adv, mask, seq_cfg)
    assert seq.item() == pytest.approx((-1.1 + -2.0) / 2)
    # micro-batches share the batch's normalizer
    tok10, _ = ppo_loss(logp, zeros, zeros, adv, mask, NO_IW, num_tokens=10.0)
    assert tok10.item() == pytest.approx((-1.1 - 6) / 10)
    seq4, _ = ppo_loss(logp, zeros, zeros, adv, mask, seq_cfg, num_seqs=4.0)
    assert seq4.item() == pytest.approx(-3.1 / 4)
    with pytest.raises(ValueError):
        ppo_loss(logp, zeros, zeros, adv, mask, LossConfig(aggregation="sum"))


def test_kl_to_base_k3() -> None:
    cfg = LossConfig(behav_weight_cap=None, band_low=None, band_high=None, kl_coef=0.1)
    loss, m, lp = one(L(0.5), prox=L(0.5), behav=L(0.5), adv=0.0, cfg=cfg, ref_logp=t([0.0]))
    k3 = 2.0 - L(2.0) - 1.0  # d = ref - logp = ln 2: e^d - d - 1
    assert m["kl"] == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.1 * k3)
    loss.backward()
    assert lp.grad.item() == pytest.approx(0.1 * (1 - 2.0))  # d/dlogp (e^d - d - 1) = 1 - e^d
    # no reference or coefficient 0: no KL term
    loss0, m0, _ = one(L(0.5), prox=L(0.5), behav=L(0.5), adv=0.0, ref_logp=t([0.0]))
    assert loss0.item() == 0.0 and m0["kl"] == 0.0


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    # A < 0, ratio 5: PPO's pessimistic bound keeps -A * 5 = 5 (its gradient pushes on)
    loss, m, _ = one(L(5.0), adv=-1.0)
    assert loss.item() == pytest.approx(5.0) and m["dual_clip_frac"] == 0.0
    cfg = LossConfig(
        behav_weight_cap=None, band_low=None, band_high=None, kl_coef=0.0, dual_clip=3.0
    )
    loss, m, lp = one(L(5.0), adv=-1.0, cfg=cfg)
    assert loss.item() == pytest.approx(3.0) and m["dual_clip_frac"] == 1.0
    loss.backward()
    assert lp.grad.item() == 0.0  # the cap is constant in logp
    # below the cap, and for A > 0, nothing changes
    loss, m, _ = one(L(2.0), adv=-1.0, cfg=cfg)
    assert loss.item() == pytest.approx(2.0) and m["dual_clip_frac"] == 0.0
    loss, _, _ = one(L(5.0), adv=1.0, cfg=cfg)
    assert loss.item() == pytest.approx(-1.28)
