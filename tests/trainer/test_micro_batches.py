"""Length-bucketed micro-batches: a sample's logprobs do not depend on what it is batched
with (padding is masked), and batches keep to their token budget. Real packaged model."""

from __future__ import annotations

import random

import torch

from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from tests.servers import MODEL_CACHE
from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.policy import Policy, make_micro_batches


def _samples(n: int) -> list[Sample]:
    rng = random.Random(3)
    out = []
    for i in range(n):
        p, c = rng.randint(5, 40), rng.randint(1, 12)
        out.append(
            Sample(
                f"s{i}",
                [rng.randrange(100, 40000) for _ in range(p)],
                [rng.randrange(100, 40000) for _ in range(c)],
                [-1.0] * c,
                rng.choice([0.7, 1.0]),
                0.0,
                f"g{i}",
                "t",
            )
        )
    return out


def test_budget_and_order() -> None:
    samples = _samples(30)
    batches = make_micro_batches(samples, budget=120)
    assert sorted(s.interaction_id for b in batches for s in b.samples) == sorted(
        s.interaction_id for s in samples
    )
    for b in batches:
        assert b.padded_tokens <= 120 or len(b.samples) == 1
        assert b.tokens <= b.padded_tokens
    lengths = [s.length for b in batches for s in b.samples]
    assert lengths == sorted(lengths, reverse=True)


def test_logprobs_do_not_depend_on_the_batch() -> None:
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    policy = Policy.load(model_dir, TrainConfig(lora_rank=4))
    samples = _samples(6)
    together = policy.logprobs(make_micro_batches(samples, budget=10_000))
    assert len(make_micro_batches(samples, budget=10_000)) == 1
    alone = policy.logprobs(make_micro_batches(samples, budget=1))
    for s in samples:
        assert together[s.interaction_id].shape == (len(s.completion_ids),)
        torch.testing.assert_close(
            together[s.interaction_id], alone[s.interaction_id], atol=2e-4, rtol=0
        )


def test_a_one_step_run_forwards_each_sample_once(monkeypatch) -> None:
    """The first minibatch's proximal logprobs come from its own forward: one step, one
    forward per micro-batch; later minibatches get a proximal pass up front."""
    from trainer.train import train

    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    samples = _samples(8)
    for i, s in enumerate(samples):
        s.advantage = 1.0 if i % 2 else -1.0
    for n_mb, expected_rows in ((1, 8), (2, 8 + 4)):
        cfg = TrainConfig(  # no band: the made-up behaviour logprobs would mask every token
            lora_rank=4,
            num_minibatches=n_mb,
            lr=1e-3,
            micro_batch_tokens=10**6,
            band_low=None,
            band_high=None,
            behav_weight_cap=None,
            kl_coef=0.0,
            kl_prox_target=None,  # no base-model pass, no early stop
        )
        policy = Policy.load(model_dir, cfg)
        rows: list[int] = []
        real = policy.forward  # every forward of a micro-batch, with or without gradient

        def counting(batch, entropy_grad=None, at=None, real=real, rows=rows):  # type: ignore[no-untyped-def]
            rows.append(len(batch.samples))
            return real(batch, entropy_grad, at)

        monkeypatch.setattr(policy, "forward", counting)
        steps = train(policy, policy.make_optimizer(cfg, None), samples, cfg, progress=False)
        assert sum(rows) == expected_rows
        assert len(steps) == n_mb
        assert steps[0]["ratio_mean"] == 1.0 and steps[0]["clip_frac"] == 0.0
        if n_mb == 2:  # the second step sees the first step's update against proximal
            assert steps[1]["ratio_mean"] != 1.0


def _grouped(n_groups: int, size: int) -> list[Sample]:
    rng = random.Random(5)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(6, 30))]
        for i in range(size):
            c = rng.randint(1, 9)
            out.append(
                Sample(
                    f"g{g}s{i}",
                    prompt,
                    [rng.randrange(100, 40000) for _ in range(c)],
                    [-1.0] * c,
                    0.8,
                    0.0,
                    f"g{g}",
                    "t",
                    advantage=(-1.0) ** i,
                )
            )
    return out


def test_shared_prompt_forward_matches_the_padded_one() -> None:
    """A group's prompt forwarded once (KV cache repeated per completion) gives the same
    logprobs and the same LoRA gradient as one full row per sample."""
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    policy = Policy.load(model_dir, TrainConfig(lora_rank=4))
    with torch.no_grad():  # a non-zero adapter, so the prompt's gradient matters
        for p in policy.params:
            p.normal_(0, 0.02)
    samples = _grouped(3, 4)
    (batch,) = make_micro_batches(samples, budget=10_000)
    assert batch.shares_prompts and batch.padded_tokens < sum(s.length for s in samples)
    grads = []
    results = []
    for forward in (policy.shared_prompt_hidden, policy.padded_hidden):
        policy.model.zero_grad(set_to_none=True)
        lps = policy.head(forward(batch), batch.samples)[0]
        sum(lp.sum() * s.advantage for lp, s in zip(lps, batch.samples, strict=True)).backward()
        results.append([lp.detach() for lp in lps])
        grads.append(torch.cat([p.grad.flatten() for p in policy.params]))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=0)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-3)
    assert grads[0].abs().sum() > 0


def test_minibatches_keep_each_group_together() -> None:
    """A run's minibatches hold whole groups (so each forwards its prompts once), cover
    every sample once, and stay balanced; with fewer groups than minibatches the samples
    are dealt one by one, so the clip still acts over several steps."""
    from trainer.train import minibatches

    samples = _grouped(9, 8) + _grouped(1, 3)[:3]  # 9 groups of 8 and a group of 3
    for s in samples[-3:]:
        s.prompt_ids = [7, 7, 7]
    batches = minibatches(samples, 4, random.Random(0))
    assert len(batches) == 4
    ids = sorted(s.interaction_id for b in batches for s in b)
    assert ids == sorted(s.interaction_id for s in samples)
    for b in batches:
        prompts = {tuple(s.prompt_ids) for s in b}
        for p in prompts:  # every sample of that prompt is in this batch
            assert sum(tuple(s.prompt_ids) == p for s in samples) == sum(
                tuple(s.prompt_ids) == p for s in b
            )
    sizes = sorted(len(b) for b in batches)
    assert sizes[-1] - sizes[0] <= 8
    assert minibatches(samples, 4, random.Random(0)) == batches  # seeded
    one_group = _grouped(1, 8)
    assert [len(b) for b in minibatches(one_group, 4, random.Random(0))] == [2, 2, 2, 2]
