"""Cross-row shared prefix (trainer/forward.py): the tokens common to every row of a
micro-batch (a system prompt, tool specs) are forwarded once and their KV cache expanded
to the rows; per-token logprobs and the LoRA gradient equal those of plain padded rows.
Rows with a long common prefix pack more per micro-batch; without one nothing changes."""

from __future__ import annotations

import random
import time

import pytest
import torch

from tests.trainer.test_prefix_merge import _ids, _policy, session
from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.forward import MIN_SHARED_PREFIX, _Shape
from trainer.policy import make_micro_batches

OFF = 10**9  # min_prefix: the shared prefix off


def _sample(sid: str, prompt: list[int], c: list[int], rng: random.Random, **kw) -> Sample:  # type: ignore[no-untyped-def]
    return Sample(
        sid, prompt, c, [-1.0] * len(c), rng.choice([0.7, 1.0]), 0.0, sid, "t",
        advantage=rng.uniform(-1.5, 1.5), **kw,
    )  # fmt: skip


def _questions(rng: random.Random, system: list[int], n: int) -> list[Sample]:
    """Rows of one system prompt + a different question each."""
    return [
        _sample(f"q{i}", system + _ids(rng, rng.randint(3, 15)), _ids(rng, rng.randint(1, 8)), rng)
        for i in range(n)
    ]


def _groups(rng: random.Random, system: list[int]) -> list[Sample]:
    """Two GRPO groups (identical prompts) mixed with single questions."""
    out = _questions(rng, system, 3)
    for g in range(2):
        prompt = system + _ids(rng, rng.randint(4, 12))
        out += [_sample(f"g{g}s{i}", prompt, _ids(rng, rng.randint(1, 6)), rng) for i in range(3)]
    return out


def _sessions(rng: random.Random, system: list[int]) -> list[Sample]:
    """Merged chains whose first prompts start with the system prompt, and a single."""
    out = [
        s for i in range(3) for s in session(rng, f"S{i}", 2 + i % 2, prompt=system + _ids(rng, 5))
    ]
    return out + _questions(rng, system, 1)


# ---- packing and cost (no model) ------------------------------------------------------


def test_no_common_prefix_is_as_before() -> None:
    rng = random.Random(0)
    samples = _questions(rng, [], 12) + _groups(rng, [])
    for merge in (False, True):
        on = make_micro_batches(samples, 150, merge)
        off = make_micro_batches(samples, 150, merge, min_prefix=OFF)
        assert [[s.interaction_id for s in b.samples] for b in on] == [
            [s.interaction_id for s in b.samples] for b in off
        ]
        for b in on:
            assert b.prefix == 0
            rows = b.rows
            if b.shares_prompts:
                prompts = {tuple(s.prompt_ids) for s in b.samples}
                assert b.padded_tokens == len(prompts) * max(map(len, prompts)) + len(
                    b.samples
                ) * max(len(s.completion_ids) for s in b.samples)
            else:
                assert b.padded_tokens == len(rows) * max(r[-1].length for r in rows)
                assert b.forward_tokens == sum(r[-1].length for r in rows)


def test_a_long_common_prefix_packs_more_rows() -> None:
    rng = random.Random(1)
    system = _ids(rng, 500)
    samples = _questions(rng, system, 64)
    on = make_micro_batches(samples, 4096)
    off = make_micro_batches(samples, 4096, min_prefix=OFF)
    assert len(on) < len(off) and max(len(b.rows) for b in on) > 2 * max(len(b.rows) for b in off)
    for b in on:
        assert b.padded_tokens <= 4096 or len(b.rows) == 1
        if len(b.rows) > 1:
            assert b.prefix == 500  # capped before every position that predicts a token
    assert sum(b.forward_tokens for b in on) < sum(b.forward_tokens for b in off) / 4
    # the prefix ends before the first position that predicts a sampled token
    short = _sample("short", system[:40], [1, 2], rng)
    (b,) = make_micro_batches([*samples[:3], short], 10**6)
    assert b.prefix == 39


def test_packing_is_fast() -> None:
    rng = random.Random(2)
    system = _ids(rng, 500)
    samples = _questions(rng, system, 256) + _groups(rng, system) * 10
    t = time.perf_counter()
    batches = make_micro_batches(samples, 8192)
    assert time.perf_counter() - t < 1.0
    assert sum(len(b.samples) for b in batches) == len(samples)


def test_shape_cost_chooses_the_cheaper_path() -> None:
    rng = random.Random(3)
    system = _ids(rng, 200)
    samples = _groups(rng, system)
    shape = _Shape(MIN_SHARED_PREFIX).add([[s] for s in samples])
    assert shape.prefix >= 200 and shape.can_share_prompts
    assert shape.cost() == min(shape.padded_cost(), shape.shared_cost())


# ---- the same numbers (real packaged model, float32 CPU) ---------------------------


@pytest.fixture(scope="module")
def model_dir():  # type: ignore[no-untyped-def]
    from engine.model_files import PACKAGED_MODEL, resolve_model_dir
    from tests.servers import MODEL_CACHE

    return resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)


def _run(policy, batch, fn):  # type: ignore[no-untyped-def]
    policy.model.zero_grad(set_to_none=True)
    lps = fn(batch)
    loss = sum((lp * s.advantage).sum() for lp, s in zip(lps, batch.samples, strict=True))
    loss.backward()
    return [lp.detach() for lp in lps], torch.cat([p.grad.flatten() for p in policy.params])


def test_shared_prefix_forward_equals_padded_rows(model_dir) -> None:  # type: ignore[no-untyped-def]
    """Different questions after one system prompt, merged chains, and GRPO groups mixed
    with single questions: logprobs and the LoRA gradient equal plain padded rows'."""
    policy = _policy(model_dir, TrainConfig(lora_rank=4))
    rng = random.Random(4)
    system = _ids(rng, 48)
    cases = {
        "questions": (_questions(rng, system, 5), False),
        "sessions": (_sessions(rng, system), True),
        "groups": (_groups(rng, system), False),
    }
    for name, (samples, merge) in cases.items():
        (batch,) = make_micro_batches(samples, 10**6, merge)
        assert batch.prefix >= 48, name
        if merge:
            assert batch.merged_turns > 0

        def padded(b, prefix):  # type: ignore[no-untyped-def]
            return policy.head(policy.padded_hidden(b, prefix), b.samples)[0]

        plain_lp, plain_g = _run(policy, batch, lambda b: padded(b, 0))
        fns = {"chosen": lambda b: policy.batch_logprobs_entropy(b, None)[0]}
        fns["padded"] = lambda b: padded(b, b.prefix)
        if name == "groups":
            assert batch.shares_prompts  # prompts after the prefix once, then completions
            fns["shared"] = lambda b: policy.head(
                policy.shared_prompt_hidden(b, b.prefix), b.samples
            )[0]
        for how, fn in fns.items():
            lp, g = _run(policy, batch, fn)
            for a, b in zip(lp, plain_lp, strict=True):
                torch.testing.assert_close(a, b, atol=2e-4, rtol=0, msg=f"{name}/{how}")
            torch.testing.assert_close(g, plain_g, atol=1e-4, rtol=1e-3, msg=f"{name}/{how}")
        assert plain_g.abs().sum() > 0
