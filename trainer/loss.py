"""Decoupled PPO loss (pure torch, one screen).

Three policies meet here, per sampled token:
- behaviour ``mu``: the recorded logprobs (what the engine sampled with, maybe stale);
- proximal ``pi_prox``: the current adapter before this run's update (recomputed);
- current ``pi_theta``: the adapter being optimized (carries the gradient).

    ratio   = pi_theta / pi_prox                  clipped to [1 - eps_low, 1 + eps_high]
    pg      = max(-A * ratio, -A * clip(ratio))   (PPO's pessimistic bound)
    w       = pi_prox / mu                        behaviour importance weight (no gradient)
    keep    = band_low <= w <= band_high          tokens outside the band are masked (IcePop)
    loss_t  = min(w, w_cap) * pg * keep  +  kl_coef * k3(pi_theta || pi_base)

Aggregation: ``token-mean`` divides the sum over sampled tokens by their number;
``seq-mean`` averages per sequence first, then over sequences. Masked tokens count in the
denominators (they contribute zero), so masking never rescales the other tokens.
``num_tokens`` / ``num_seqs`` let micro-batches share the normalizer of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28
    behav_weight_cap: float | None = 5.0  # truncation of pi_prox / mu (None: off)
    band_low: float | None = 0.5  # IcePop band on pi_prox / mu (None: no lower bound)
    band_high: float | None = 2.0  # (None: no upper bound)
    kl_coef: float = 0.0  # k3 KL to the base model (adapter disabled)
    aggregation: str = "token-mean"  # or "seq-mean"


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor):
    """log_softmax(logits / T)[target]; T is per row (broadcast), T == 0 means T = 1."""
    t = torch.where(temperature > 1e-6, temperature, torch.ones_like(temperature))
    scaled = logits.float() / t.unsqueeze(-1).to(torch.float32)
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def ppo_loss(
    logp: torch.Tensor,  # [B, T] current policy, requires grad
    prox_logp: torch.Tensor,  # [B, T] proximal policy
    behav_logp: torch.Tensor,  # [B, T] recorded behaviour policy
    advantages: torch.Tensor,  # [B] or [B, T]
    mask: torch.Tensor,  # [B, T] bool: sampled tokens
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,  # [B, T] base model, for the KL term
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    mask = mask.bool()
    m = mask.float()
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(logp)
    prox_logp, behav_logp = prox_logp.detach(), behav_logp.detach()

    ratio = torch.exp(logp - prox_logp)
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    pg1, pg2 = -adv * ratio, -adv * clipped
    pg = torch.maximum(pg1, pg2)

    w = torch.exp(prox_logp - behav_logp)
    keep = mask.clone()
    if cfg.band_low is not None:
        keep &= w >= cfg.band_low
    if cfg.band_high is not None:
        keep &= w <= cfg.band_high
    w_used = w.clamp(max=cfg.behav_weight_cap) if cfg.behav_weight_cap is not None else w
    per_token = w_used * pg * keep.float()

    kl = torch.zeros_like(logp)
    if cfg.kl_coef and ref_logp is not None:
        d = ref_logp.detach() - logp
        kl = torch.exp(d) - d - 1.0  # k3 estimator of KL(pi_theta || pi_base), >= 0
        per_token = per_token + cfg.kl_coef * kl * m

    if cfg.aggregation == "token-mean":
        denom = num_tokens if num_tokens is not None else m.sum().clamp(min=1.0)
        loss = (per_token * m).sum() / denom
    elif cfg.aggregation == "seq-mean":
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        denom = num_seqs if num_seqs is not None else float(logp.shape[0])
        loss = per_seq.sum() / denom
    else:
        raise ValueError(f"aggregation {cfg.aggregation!r}: use token-mean or seq-mean")

    n = m.sum().clamp(min=1.0)
    with torch.no_grad():
        metrics = {
            "clip_frac": float(((pg2 > pg1) & mask).float().sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
            "iw_mean": float((w * m).sum() / n),
            "iw_max": float(w[mask].max()) if mask.any() else 0.0,
            "iw_min": float(w[mask].min()) if mask.any() else 0.0,
            "masked_frac": float((mask & ~keep).float().sum() / n),
            "kl": float((kl * m).sum() / n),
            "tokens": float(m.sum()),
        }
    return loss, metrics
