"""The optimization loop of one run: proximal (and base) logprobs, then PPO steps."""

from __future__ import annotations

import logging
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm.auto import tqdm

from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.dist import LOCAL, Dist, split_even
from trainer.loss import ppo_loss, token_advantages, topk_kl
from trainer.merge import chains
from trainer.merge import units as merge_units
from trainer.metrics import combine, finish
from trainer.policy import MicroBatch, Policy, TeacherScores, make_micro_batches

log = logging.getLogger("rlgate.trainer")


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}_mean": statistics.fmean(values),
        f"{prefix}_std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        f"{prefix}_min": min(values),
        f"{prefix}_max": max(values),
    }


def _pad(rows: list[torch.Tensor]) -> torch.Tensor:
    return pad_sequence(rows, batch_first=True)


def minibatches(samples: list[Sample], n: int, rng: random.Random) -> list[list[Sample]]:
    """``n`` minibatches of one epoch, in a shuffled order. The samples of one prompt (a
    GRPO group) stay in one minibatch, so its forward runs the prompt once (trainer/policy.py:
    about 5x fewer tokens for groups of 8 short answers), and so do the turns of a session
    that extend each other (trainer/merge.py), so they can be one row. This holds whether
    ``merge_turns`` is on or not: the switch changes how a minibatch is forwarded, never
    which samples share a step. Units are dealt largest first to the smallest minibatch.
    With fewer units than ``n``, samples are dealt one by one (the turns of a session then
    merge within each minibatch: extension is transitive)."""
    units = merge_units(samples)
    if len(units) < n:
        units = [[s] for s in samples]
    rng.shuffle(units)
    units.sort(key=len, reverse=True)  # stable: equal sizes keep the shuffled order
    out: list[list[Sample]] = [[] for _ in range(n)]
    for unit in units:
        min(out, key=len).extend(unit)
    rng.shuffle(out)
    return [b for b in out if b]


def forward_stats(
    batches: list[MicroBatch], samples: list[Sample], cfg: TrainConfig
) -> dict[str, int]:
    """Tokens these micro-batches forward, tokens the merge saved against one row per turn
    (same budget), and turns forwarded inside merged rows."""
    done = sum(b.forward_tokens for b in batches)
    if not cfg.merge_turns:
        return {"forward_tokens": done, "forward_tokens_saved": 0, "merged_turns": 0}
    per_turn = make_micro_batches(samples, cfg.micro_batch_tokens, merge=False)
    return {
        "forward_tokens": done,
        "forward_tokens_saved": sum(b.forward_tokens for b in per_turn) - done,
        "merged_turns": sum(b.merged_turns for b in batches),
    }


def _plain_cost(b: MicroBatch) -> int:
    return len(b.rows) * max(r[-1].length for r in b.rows)


def rank_logprobs(
    policy: Policy, batches: list[MicroBatch], adapter: bool, dist: Dist = LOCAL
) -> dict[str, torch.Tensor]:
    """:meth:`Policy.logprobs` of ``batches``, every rank's share (:func:`rank_scores`)."""
    return rank_scores(batches, lambda mine: policy.logprobs(mine, adapter), policy.device, dist)


def rank_scores(
    batches: list[MicroBatch],
    score: Callable[[list[MicroBatch]], dict[str, Any]],
    device: torch.device,
    dist: Dist = LOCAL,
) -> dict[str, Any]:
    """``score(batches)`` (a dict of tensors, or of tuples of tensors, by interaction id);
    with several ranks each scores its share (padded with the smallest batch to as many
    forwards as the busiest rank: FSDP's gathers must pair up) and every rank gets all."""
    if not dist.on:
        return score(batches)
    parts = split_even([_plain_cost(b) for b in batches], dist.world)
    mine = [batches[i] for i in parts[dist.rank]]
    if batches:
        smallest = min(batches, key=_plain_cost)
        mine += [smallest] * (max(map(len, parts)) - len(mine))
    out: dict[str, Any] = {}
    for got in dist.gather({k: v.to("cpu") for k, v in score(mine).items()}):
        out.update({k: v.to(device) for k, v in got.items()})
    return out


def rank_micro_batches(
    batch: list[Sample], cfg: TrainConfig, dist: Dist = LOCAL
) -> tuple[list[MicroBatch], list[MicroBatch], int]:
    """A step's micro-batches: all of them (every rank's, for the step's metrics), this
    rank's, and how many each rank runs. With several ranks the minibatch's rows (a
    sample, or a chain of merged turns) are dealt to the ranks by tokens, and each rank
    packs its own micro-batches."""
    budget, merge = cfg.micro_batch_tokens, cfg.merge_turns
    if not dist.on:
        micro = make_micro_batches(batch, budget, merge)
        return micro, micro, len(micro)
    rows = chains(batch) if merge else [[s] for s in batch]
    parts = split_even([r[-1].length for r in rows], dist.world)
    per_rank = [
        make_micro_batches([s for i in part for s in rows[i]], budget, merge) for part in parts
    ]
    return [b for p in per_rank for b in p], per_rank[dist.rank], max(map(len, per_rank))


def hint_teacher_scores(
    policy: Policy, samples: list[Sample], cfg: TrainConfig, dist: Dist = LOCAL
) -> dict[str, TeacherScores]:
    """The hinted teacher's view (:class:`TeacherScores`) of every sample with a hint
    (trainer/hints.py), by interaction id, before any step: the teacher is the base model
    (``hint_teacher = "base"``, the adapter off) or the policy as it starts this run. Its
    ``distill_topk`` likeliest tokens per position only with ``distill_weight``; nothing
    when neither ``hint_weight`` nor ``distill_weight`` is set."""
    hinted = [s for s in samples if s.hinted_prompt is not None]
    if not hinted or not (cfg.hint_weight or cfg.distill_weight):
        return {}
    rows = [replace(s, prompt_ids=s.hinted_prompt, session_id="") for s in hinted]
    batches = make_micro_batches(rows, cfg.micro_batch_tokens, merge=False)
    k = cfg.distill_topk if cfg.distill_weight else 0
    adapter = cfg.hint_teacher == "policy"
    return rank_scores(
        batches, lambda mine: policy.teacher_scores(mine, adapter, k), policy.device, dist
    )


def _hint_gap_mean(
    rows: list[Sample], teacher: dict[str, TeacherScores], prox: dict[str, torch.Tensor], cfg
) -> float:
    """Mean clipped hint advantage over the hinted samples' tokens (0.0 without any)."""
    gaps = [
        (teacher[s.interaction_id].logp - prox[s.interaction_id].to(teacher[s.interaction_id].logp))
        .clamp(-cfg.hint_clip, cfg.hint_clip)
        .cpu()
        for s in rows
    ]
    return float(torch.cat(gaps).mean()) if gaps else 0.0


def train(
    policy: Policy,
    opt: torch.optim.Optimizer,
    samples: list[Sample],
    cfg: TrainConfig,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    policy_version: int = 0,
    hint_gaps: dict[str, float] | None = None,
    dist: Dist = LOCAL,
) -> list[dict[str, Any]]:
    """Run up to ``epochs * num_minibatches`` optimizer steps; returns per-step metrics.

    Trust region: before each step the minibatch's ``kl_prox`` (how far the adapter has
    moved from the proximal one, measured on that minibatch) is compared with
    ``cfg.kl_prox_target``; above it, the step is not taken and the run stops (the last
    recorded step says ``stopped_early``). ``policy_version``: the version the adapter was
    warm-started from (0: a fresh adapter, the base model); samples of any other version
    count as stale in the masked fractions.

    Proximal logprobs are those of the adapter before the first step. The first minibatch
    is forwarded by exactly that adapter, so its proximal logprobs are taken from its own
    forward (detached) and only the other samples get a separate no-gradient pass: a run
    of one step costs one forward and one backward. (Not with LoRA dropout, where the
    training forward is not the proximal one.)

    With ``cfg.merge_turns`` every forward (proximal, base, training) runs the turns of a
    session that extend each other as one row (trainer/merge.py; the loss is unchanged).
    Each step records ``forward_tokens``, ``forward_tokens_saved`` (against one row per
    turn) and ``merged_turns``; the first step also the no-gradient passes before it
    (``no_grad_forward_tokens``, ``no_grad_forward_tokens_saved``).

    Samples with a hint (``hinted_prompt``, trainer/hints.py) get per-token advantages
    (trainer/loss.py ``token_advantages``) from a teacher pass before the first step;
    ``hint_gaps`` receives each one's mean clipped hint advantage (first epoch).

    With ``dist`` (rank r of N, trainer/dist.py) every rank runs this same loop on the
    same samples and config: the no-gradient passes and each step's micro-batches are
    split between the ranks, the gradients summed, and the loss metrics gathered, so every
    rank takes the same steps and returns the same metrics (accounting aside: a step's
    ``micro_batches`` and forward tokens count every rank's).
    """
    dev = policy.device
    rng = random.Random(cfg.seed)
    n_mb = min(cfg.num_minibatches, len(samples))
    epochs = [minibatches(samples, n_mb, rng) for _ in range(cfg.epochs)]
    reuse_first = cfg.lora_dropout == 0.0
    first_ids = {s.interaction_id for s in epochs[0][0]} if reuse_first else set()
    rest = [s for s in samples if s.interaction_id not in first_ids]
    budget, merge = cfg.micro_batch_tokens, cfg.merge_turns
    prox_batches = make_micro_batches(rest, budget, merge)
    prox = rank_logprobs(policy, prox_batches, True, dist)
    no_grad = forward_stats(prox_batches, rest, cfg)
    ref = None
    if cfg.kl_coef:
        ref_batches = make_micro_batches(samples, budget, merge)
        ref = rank_logprobs(policy, ref_batches, False, dist)
        for k, v in forward_stats(ref_batches, samples, cfg).items():
            no_grad[k] += v
    teacher = hint_teacher_scores(policy, samples, cfg, dist)
    steps: list[dict[str, Any]] = []
    total = cfg.epochs * n_mb
    bar = tqdm(
        total=total,
        desc="train",
        unit="step",
        file=sys.stderr,
        disable=not (progress and dist.main),
    )
    policy.model.train()
    for epoch, batches in enumerate(epochs):
        for mb_index, batch in enumerate(batches):
            started = time.perf_counter()
            micro, mine, rounds = rank_micro_batches(batch, cfg, dist)
            num_tokens = float(sum(len(s.completion_ids) for s in batch))
            num_seqs = float(len(batch))
            opt.zero_grad(set_to_none=True)
            losses: list[float] = []
            ms: list[dict[str, float]] = []
            first = epoch == 0 and mb_index == 0 and reuse_first
            for mb in mine:
                ss = mb.samples
                distill = bool(cfg.distill_weight) and any(s.interaction_id in teacher for s in ss)
                at = (
                    [
                        teacher[i].top_index if (i := s.interaction_id) in teacher else None
                        for s in ss
                    ]
                    if distill
                    else None
                )
                logps, ents, picked = policy.forward(mb, bool(cfg.entropy_coef), at)
                if first:
                    for s, lp in zip(ss, logps, strict=True):
                        prox[s.interaction_id] = lp.detach().float()
                mask = _pad([torch.ones(len(s.completion_ids), dtype=torch.bool) for s in ss])
                prox_mb = _pad([prox[s.interaction_id] for s in ss]).to(dev)
                hinted = [s.interaction_id in teacher for s in ss]
                adv = token_advantages(
                    torch.tensor([s.advantage for s in ss], device=dev),
                    mask.to(dev),
                    cfg,
                    _pad([_teacher_logp(teacher, prox, s.interaction_id) for s in ss]).to(dev)
                    if any(hinted)
                    else None,
                    prox_mb,
                    torch.tensor(hinted, device=dev),
                )
                if epoch == 0 and hint_gaps is not None:
                    for s in ss:
                        if s.interaction_id in teacher:
                            hint_gaps[s.interaction_id] = _hint_gap_mean([s], teacher, prox, cfg)
                loss, m = ppo_loss(
                    _pad([lp.float() for lp in logps]),
                    prox_mb,
                    _pad([torch.tensor(s.behav_logprobs) for s in ss]).to(dev),
                    adv,
                    mask.to(dev),
                    cfg,  # a TrainConfig is the LossConfig
                    ref_logp=_pad([ref[s.interaction_id] for s in ss]).to(dev) if ref else None,
                    entropy=_pad(ents).to(dev) if ents is not None else None,
                    distill=_distill(teacher, ss, picked, dev) if distill else None,
                    stale=torch.tensor([s.version != policy_version for s in ss]),
                    num_tokens=num_tokens,
                    num_seqs=num_seqs,
                )
                loss.backward()
                losses.append(float(loss.detach()))
                ms.append(m)
            for _ in range(rounds - len(mine)):  # as many layer calls as the busiest rank
                _idle_pass(policy, min(micro, key=_plain_cost))
            if dist.on:
                ids = [s.interaction_id for b in mine for s in b.samples] if first else []
                own = {i: prox[i].cpu() for i in ids}  # the first step's proximal logprobs
                got = dist.gather((losses, ms, own))
                losses = [x for g in got for x in g[0]]
                ms = [m for g in got for m in g[1]]
                prox.update({k: v.to(dev) for g in got for k, v in g[2].items()})
            loss_total = sum(losses)
            agg: dict[str, float] = {}
            for m in ms:
                combine(agg, m)  # as trainer/metrics.py says per metric
            seen_tokens = sum(mb.tokens for mb in micro)
            finish(agg, num_tokens)
            target = cfg.kl_prox_target
            if target is not None and steps and agg["kl_prox"] > target:
                opt.zero_grad(set_to_none=True)
                steps[-1]["stopped_early"] = True
                steps[-1]["stop_kl_prox"] = agg["kl_prox"]
                log.info(
                    "trust region: kl_prox %.4f > %.4f before step %d/%d: run stops here",
                    agg["kl_prox"],
                    target,
                    len(steps) + 1,
                    total,
                )
                break
            dist.all_reduce_grads(policy.params)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.params, cfg.max_grad_norm))
            if cfg.step_delay_s:
                time.sleep(cfg.step_delay_s)
            opt.step()
            elapsed = time.perf_counter() - started
            hint_rows = [s for s in batch if s.interaction_id in teacher]
            metrics: dict[str, Any] = {
                "step": len(steps) + 1,
                "epoch": epoch,
                "loss": loss_total,
                **_stats([s.reward for s in batch], "reward"),
                **_stats([s.advantage for s in batch], "adv"),
                "sampled_neg_logprob": -sum(x for s in batch for x in s.behav_logprobs)
                / max(num_tokens, 1.0),
                **agg,
                "grad_norm": grad_norm,
                "hinted_seqs": len(hint_rows),
                "hint_adv_mean": _hint_gap_mean(hint_rows, teacher, prox, cfg),
                "num_seqs": int(num_seqs),
                "num_tokens": int(num_tokens),
                "batch_tokens": seen_tokens,
                "micro_batches": len(micro),
                **forward_stats(micro, batch, cfg),
                "seconds": elapsed,
                "tokens_per_s": seen_tokens / elapsed if elapsed > 0 else 0.0,
                "lr": opt.param_groups[0]["lr"],
            }
            if not steps:  # the no-gradient passes before the first step
                metrics["no_grad_forward_tokens"] = no_grad["forward_tokens"]
                metrics["no_grad_forward_tokens_saved"] = no_grad["forward_tokens_saved"]
            steps.append(metrics)
            log.info(
                "step %d/%d loss=%.4f reward=%.3f clip=%.3f iw=%.3f masked=%.3f "
                "(stale %.3f, mismatch %.3f) kl=%.4f kl_prox=%.4f entropy=%.3f gnorm=%.3f "
                "tok/s=%.0f",
                metrics["step"],
                total,
                metrics["loss"],
                metrics.get("reward_mean", 0.0),
                agg["clip_frac"],
                agg["iw_mean"],
                agg["masked_frac"],
                agg["masked_stale_frac"],
                agg["masked_mismatch_frac"],
                agg["kl"],
                agg["kl_prox"],
                agg["entropy"],
                grad_norm,
                metrics["tokens_per_s"],
            )
            bar.update(1)
            bar.set_postfix(loss=f"{loss_total:.4f}")
            if on_step is not None:
                on_step(metrics)
        else:
            continue
        break  # the trust region stopped the run
    bar.close()
    if dist.on and hint_gaps is not None:
        for got in dist.gather(dict(hint_gaps)):
            hint_gaps.update(got)
    return steps


def _teacher_logp(
    teacher: dict[str, TeacherScores], prox: dict[str, torch.Tensor], iid: str
) -> torch.Tensor:
    return teacher[iid].logp if iid in teacher else prox[iid]


def _distill(
    teacher: dict[str, TeacherScores],
    samples: list[Sample],
    picked: list[torch.Tensor | None],
    dev: torch.device,
) -> torch.Tensor:
    """[B, T] :func:`trainer.loss.topk_kl` of each hinted sample's teacher to the policy at
    its answer's positions (with the policy's gradient); zeros for the samples without."""
    rows = []
    for s, mine in zip(samples, picked, strict=True):
        if mine is None:
            rows.append(torch.zeros(len(s.completion_ids), device=dev))
        else:
            rows.append(topk_kl(teacher[s.interaction_id].top_logp.to(dev), mine))
    return _pad(rows)


def _idle_pass(policy: Policy, mb: MicroBatch) -> None:
    """A forward and backward that change nothing (its loss is weighted 0): a rank with
    fewer micro-batches than another still runs every FSDP gather the others run."""
    logps, _ = policy.batch_logprobs_entropy(mb, None)
    (torch.stack([lp.sum() for lp in logps]).sum() * 0.0).backward()
