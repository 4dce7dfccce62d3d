"""Decoupled PPO loss (pure torch, one screen).

Three policies meet here, per sampled token:
- behaviour ``mu``: the recorded logprobs (what the engine sampled with, maybe stale);
- proximal ``pi_prox``: the current adapter before this run's update (recomputed);
- current ``pi_theta``: the adapter being optimized (carries the gradient).

    ratio   = pi_theta / pi_prox                  clipped to [1 - eps_low, 1 + eps_high]
    pg      = max(-A * ratio, -A * clip(ratio))   (PPO's pessimistic bound)
              with dual_clip c, for A < 0: min(pg, -A * c)   (dual-clip PPO)
    w       = pi_prox / mu                        behaviour importance weight (no gradient)
    keep    = band_low <= w <= band_high          tokens outside the band are masked (IcePop)
    A_t     = reward_weight * A  +  hint_weight * clip(log pi_teacher(a_t | s + hint)
                                                   - log pi_prox(a_t | s), +-hint_clip)
              (the hint term only on samples with a hint: trainer/hints.py)
    loss_t  = min(w, w_cap) * pg * keep  +  kl_coef * k3(pi_theta || pi_base)
              + distill_weight * KL_k(pi_teacher(. | s + hint) || pi_theta(. | s))
              - entropy_coef * H_t          (H_t: entropy of pi_theta at the token's position;
                                             with entropy_floor, only while mean H < floor)

KL_k (:func:`topk_kl`, samples with a hint only) is the forward KL over the teacher's whole
next-token distribution at the answer's position, coarsened to the teacher's ``distill_topk``
likeliest tokens and one bucket for the rest: it reaches tokens the answer never sampled
(ending early, for a taste of form), which the hint's token advantage cannot.

Aggregation: ``token-mean`` divides the sum over sampled tokens by their number;
``seq-mean`` averages per sequence first, then over sequences. Masked tokens count in the
denominators (they contribute zero), so masking never rescales the other tokens.
Knobs: :class:`LossConfig` (each with its default, range and help). Metrics: named in
trainer/metrics.py; ``kl_prox`` (k3 of pi_prox vs pi_theta: how far this run has moved, the trust
region's measure), ``masked_stale_frac`` / ``masked_mismatch_frac`` (masked tokens of rows
sampled by another version / by the version being trained: engine-trainer mismatch).
``num_tokens`` / ``num_seqs`` let micro-batches share the normalizer of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.knobs import knob
from trainer.metrics import loss_metrics


@dataclass
class LossConfig:
    """The loss's knobs, each declared once (trainer/knobs.py): its default, its range and
    what it does. ``TrainConfig`` (trainer/config.py) inherits them, so a project sets
    them in ``settings["training"]`` like any other knob. A new loss term: a knob here,
    its term in :func:`ppo_loss`, and (if it reports one) its metric in trainer/metrics.py."""

    eps_low: float = knob(0.2, bounds=(0.0, 1.0), help="PPO clip: ratio >= 1 - eps_low")
    eps_high: float = knob(0.28, bounds=(0.0, 10.0), help="PPO clip: ratio <= 1 + eps_high")
    behav_weight_cap: float | None = knob(
        5.0, bounds=(1.0, 10_000.0), help="truncation of pi_prox / mu (null: none)"
    )
    band_low: float | None = knob(
        0.5, bounds=(0.0, 1.0), help="IcePop band: mask tokens with pi_prox / mu below"
    )
    band_high: float | None = knob(
        2.0, bounds=(1.0, 10_000.0), help="IcePop band: mask tokens with pi_prox / mu above"
    )
    kl_coef: float = knob(
        0.02, bounds=(0.0, 10.0), help="k3 KL to the base model (adapter off): keeps it near"
    )
    entropy_coef: float = knob(
        0.0, bounds=(0.0, 10.0), help="entropy bonus (full distribution at sampled positions)"
    )
    entropy_floor: float | None = knob(
        None,
        bounds=(0.0, 20.0),  # nats; ln(vocab) is ~11 for a 49k vocabulary
        help="with entropy_coef: the bonus acts only while the mean entropy is below this",
    )
    dual_clip: float | None = knob(
        None,
        bounds=(1.0, 100.0),
        help="dual-clip PPO: for A < 0 a token's loss is at most dual_clip x abs(A) (null: off)",
    )
    reward_weight: float = knob(
        1.0, bounds=(0.0, 10.0), help="weight of the scalar reward's advantage in A_t"
    )
    hint_weight: float = knob(
        1.0,
        bounds=(0.0, 10.0),
        help="weight of a hint's per-token advantage in A_t (trainer/hints.py; 0: unused)",
    )
    hint_clip: float = knob(
        2.0, bounds=(0.01, 20.0), help="bound on a token's hint advantage (a log-ratio)"
    )
    distill_weight: float = knob(
        1.0,
        bounds=(0.0, 10.0),
        help="weight of the KL to the hinted teacher's next-token distribution (0: unused)",
    )
    distill_topk: int = knob(
        32, bounds=(1, 1024), help="teacher tokens kept per position for that KL (+ the rest)"
    )
    aggregation: str = knob(
        "token-mean",
        choices=("token-mean", "seq-mean"),
        help="mean over sampled tokens, or per sequence first",
    )


def log_softmax_at(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) per row; T is per row (broadcast), T == 0 means T = 1."""
    t = torch.where(temperature > 1e-6, temperature, torch.ones_like(temperature))
    return torch.log_softmax(logits.float() / t.unsqueeze(-1).to(torch.float32), dim=-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor):
    """log_softmax(logits / T)[target] (T as in :func:`log_softmax_at`)."""
    logp = log_softmax_at(logits, temperature)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def topk_kl(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per position [N] over the partition {each of the teacher's top
    k tokens, the rest}, from both log-probs at those tokens [N, k]: >= 0, 0 when the two
    agree on the k tokens. The gradient reaches the student through all k and the rest."""
    p_t, p_s = teacher_logp.exp(), student_logp.exp()
    rest_t = (1.0 - p_t.sum(-1)).clamp(min=1e-8)
    rest_s = (1.0 - p_s.sum(-1)).clamp(min=1e-8)
    return (p_t * (teacher_logp - student_logp)).sum(-1) + rest_t * (rest_t.log() - rest_s.log())


def k3(logp_other: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_other) from sampled tokens' logprobs (>= 0)."""
    d = logp_other - logp
    return torch.exp(d) - d - 1.0


def token_advantages(
    advantages: torch.Tensor,  # [B] the scalar reward's advantage per sample
    mask: torch.Tensor,  # [B, T] sampled tokens
    cfg: LossConfig,
    teacher_logp: torch.Tensor | None = None,  # [B, T] log pi_teacher(a_t | s + hint)
    prox_logp: torch.Tensor | None = None,  # [B, T] log pi_prox(a_t | s)
    hinted: torch.Tensor | None = None,  # [B] bool: the sample has a hint
) -> torch.Tensor:
    """A_t of the docstring above: the scalar advantage on every token, plus (on samples
    with a hint) the clipped log-ratio of the teacher that saw the hint to the policy
    that did not."""
    adv = (cfg.reward_weight * advantages).unsqueeze(-1).expand(mask.shape).clone()
    if cfg.hint_weight and teacher_logp is not None and prox_logp is not None:
        assert hinted is not None
        gap = (teacher_logp.detach() - prox_logp.detach()).clamp(-cfg.hint_clip, cfg.hint_clip)
        adv = adv + cfg.hint_weight * gap * (hinted.unsqueeze(-1) & mask.bool()).float()
    return adv


def ppo_loss(
    logp: torch.Tensor,  # [B, T] current policy, requires grad
    prox_logp: torch.Tensor,  # [B, T] proximal policy
    behav_logp: torch.Tensor,  # [B, T] recorded behaviour policy
    advantages: torch.Tensor,  # [B] or [B, T]
    mask: torch.Tensor,  # [B, T] bool: sampled tokens
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,  # [B, T] base model, for the KL term
    entropy: torch.Tensor | None = None,  # [B, T] entropy of pi_theta per position
    distill: torch.Tensor | None = None,  # [B, T] topk_kl to the hinted teacher (0: no hint)
    stale: torch.Tensor | None = None,  # [B] bool: sampled by another policy version
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
    dual = torch.zeros_like(mask)
    if cfg.dual_clip is not None:  # bound the loss of a very unlikely token with A < 0
        cap = -adv * cfg.dual_clip
        dual = (adv < 0) & (pg > cap) & mask
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)

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
        kl = k3(ref_logp.detach(), logp)  # KL(pi_theta || pi_base)
        per_token = per_token + cfg.kl_coef * kl * m
    dkl = distill if distill is not None else torch.zeros_like(logp)
    if cfg.distill_weight and distill is not None:
        per_token = per_token + cfg.distill_weight * distill * m
    ent = entropy if entropy is not None else torch.zeros_like(logp)
    mean_ent = float((ent.detach() * m).sum() / m.sum().clamp(min=1.0))
    if cfg.entropy_coef and (cfg.entropy_floor is None or mean_ent < cfg.entropy_floor):
        per_token = per_token - cfg.entropy_coef * ent * m

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
    old = (stale if stale is not None else torch.zeros(m.shape[0], dtype=torch.bool)).to(m.device)
    dropped = mask & ~keep
    with torch.no_grad():
        metrics = loss_metrics(  # each named in trainer/metrics.py
            clip_frac=float(((pg2 > pg1) & mask).float().sum() / n),
            dual_clip_frac=float(dual.float().sum() / n),
            ratio_mean=float((ratio * m).sum() / n),
            iw_mean=float((w * m).sum() / n),
            iw_max=float(w[mask].max()) if mask.any() else 0.0,
            iw_min=float(w[mask].min()) if mask.any() else 0.0,
            masked_frac=float(dropped.float().sum() / n),
            masked_stale_frac=float((dropped & old.unsqueeze(-1)).float().sum() / n),
            masked_mismatch_frac=float((dropped & ~old.unsqueeze(-1)).float().sum() / n),
            kl=float((kl * m).sum() / n),
            kl_prox=float((k3(prox_logp, logp.detach()) * m).sum() / n),
            distill_kl=float((dkl.detach() * m).sum() / n),
            entropy=mean_ent,
            tokens=float(m.sum()),
        )
    return loss, metrics
