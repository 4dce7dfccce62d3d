"""Prefix merge (trainer/merge.py): the turns of a session that extend each other
token-exactly are one forwarded row; per-token logprobs, the gradient and whole training
steps equal those of one row per turn. Turns that do not extend stay rows of their own,
and a merged session respects the micro-batch budget and the minibatching."""

from __future__ import annotations

import random

import pytest
import torch

from trainer.config import TrainConfig, TrainConfigError
from trainer.data import Sample
from trainer.merge import chains, extends, units
from trainer.policy import make_micro_batches
from trainer.runner import run_metrics
from trainer.train import minibatches


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def session(
    rng: random.Random, sid: str, turns: int, *, prompt: list[int] | None = None
) -> list[Sample]:
    """A tool-style session: each prompt is the previous prompt + its completion + new
    tokens (a tool result and the template's markers)."""
    p = list(prompt) if prompt is not None else _ids(rng, rng.randint(8, 30))
    out = []
    for k in range(turns):
        c = _ids(rng, rng.randint(2, 9))
        out.append(
            Sample(
                f"{sid}t{k}",
                list(p),
                c,
                [-1.0] * len(c),
                rng.choice([0.7, 1.0]),
                0.0,
                f"{sid}t{k}",
                "t",
                advantage=rng.uniform(-1.5, 1.5),  # each turn its own credit
                version=k % 2,  # and its own policy version (stale or not)
                session_id=sid,
            )
        )
        p = p + c + _ids(rng, rng.randint(3, 12))
    return out


# ---- which turns merge (no model) -------------------------------------------------


def test_only_token_exact_extensions_of_one_session_merge() -> None:
    rng = random.Random(0)
    a = session(rng, "A", 3)
    # a fourth turn whose prompt re-renders turn 3's answer with other tokens: no merge
    odd = Sample("At3", a[2].prompt_ids + [5] + a[2].completion_ids[1:], [9, 9], [-1.0] * 2,
                 1.0, 0.0, "x", "t", session_id="A")  # fmt: skip
    # a sibling of turn 1 (same prompt, n > 1): not an extension of it
    sib = Sample("As", a[0].prompt_ids, [8, 8, 8], [-1.0] * 3, 1.0, 0.0, "g", "t", session_id="A")
    # the same tokens in another session, and without a session: never merged
    other = Sample("B0", a[1].prompt_ids, [4], [-1.0], 1.0, 0.0, "y", "t", session_id="B")
    loose = Sample("n0", a[1].prompt_ids, [4], [-1.0], 1.0, 0.0, "z", "t")
    samples = [a[1], loose, odd, a[0], sib, other, a[2]]
    rows = chains(samples)
    assert sorted(s.interaction_id for r in rows for s in r) == sorted(
        s.interaction_id for s in samples
    )
    assert [s.interaction_id for s in rows[0]] == ["At0", "At1", "At2"]
    assert sorted(len(r) for r in rows) == [1, 1, 1, 1, 3]
    assert extends(a[2], a[0]) and not extends(odd, a[2]) and not extends(other, a[0])
    assert not extends(sib, a[0]) and not extends(loose, a[0])


def test_micro_batches_never_split_a_merged_row_and_keep_the_budget() -> None:
    rng = random.Random(1)
    samples = [s for i in range(6) for s in session(rng, f"S{i}", rng.randint(1, 5))]
    longest_turn = max(s.length for s in samples)
    for budget in (64, 200, 10_000):
        batches = make_micro_batches(samples, budget, merge=True)
        ids = sorted(s.interaction_id for b in batches for s in b.samples)
        assert ids == sorted(s.interaction_id for s in samples)
        for b in batches:
            assert b.padded_tokens <= budget or len(b.rows) == 1
            for row in b.rows:
                # a merged row is its last turn's own row: never longer than a turn's row
                assert row[-1].length <= longest_turn
                assert all(extends(later, row[0]) for later in row[1:])
        per_turn = make_micro_batches(samples, budget, merge=False)
        assert all(len(r) == 1 for b in per_turn for r in b.rows)
        merged_fwd = sum(b.forward_tokens for b in batches)
        assert merged_fwd < sum(b.forward_tokens for b in per_turn)
        last: dict[str, int] = {}
        for s in samples:  # every session is one chain: forwarded once, as its last turn
            last[s.session_id] = max(last.get(s.session_id, 0), s.length)
        assert merged_fwd == sum(last.values())


def test_minibatches_keep_a_session_together() -> None:
    """Every session's turns share a minibatch (so they merge), whatever the switch;
    first turns of sibling sessions with the same prompt (a GRPO group) join them."""
    rng = random.Random(2)
    question = _ids(rng, 12)
    samples = [s for i in range(8) for s in session(rng, f"S{i}", 3, prompt=question)]
    samples += [s for i in range(8, 16) for s in session(rng, f"S{i}", 2)]
    rng.shuffle(samples)
    batches = minibatches(samples, 4, random.Random(0))
    where = {s.interaction_id: i for i, b in enumerate(batches) for s in b}
    for unit in units(samples):
        assert len({where[s.interaction_id] for s in unit}) == 1
    assert len(units(samples)) == 1 + 8  # the 8 siblings of one question, 8 other sessions
    # fewer units than minibatches: turns are dealt one by one and merge where they meet
    one = session(rng, "L", 8)
    dealt = minibatches(one, 4, random.Random(0))
    assert [len(b) for b in dealt] == [2, 2, 2, 2]
    for b in dealt:
        assert [len(r) for r in chains(b)] == [2]  # extension is transitive


def test_switch_and_run_metrics() -> None:
    assert TrainConfig().merge_turns is True
    with pytest.raises(TrainConfigError, match="merge_turns must be true or false"):
        TrainConfig.from_project_settings({"training": {"merge_turns": "yes"}})
    steps = [
        {"epoch": 0, "merged_turns": 5, "forward_tokens": 100, "forward_tokens_saved": 60,
         "no_grad_forward_tokens": 200, "no_grad_forward_tokens_saved": 120},
        {"epoch": 0, "merged_turns": 3, "forward_tokens": 50, "forward_tokens_saved": 30},
        {"epoch": 1, "merged_turns": 8, "forward_tokens": 150, "forward_tokens_saved": 90},
    ]  # fmt: skip
    m = run_metrics(steps, 0.0)
    assert (m["merged_turns"], m["forward_tokens"], m["forward_tokens_saved"]) == (8, 500, 300)


def test_selected_rows_carry_their_session(migrated_db) -> None:  # type: ignore[no-untyped-def]
    """select_samples gives each turn its session: a session's extending turns form one
    chain; the same tokens in another session, and a turn that does not extend, do not."""
    from core.db import transaction
    from schemas.coltypes import utcnow
    from schemas.tables import InteractionRow, SessionRow
    from tests.trainer.helpers import make_project
    from trainer.data import select_samples

    pid = make_project(migrated_db, {})
    p0, c0, c1 = [1, 2, 3], [4, 5], [6]
    p1 = p0 + c0 + [7, 8]
    turns = {  # session -> (prompt, completion) per turn
        "sA": [(p0, c0), (p1, c1), (p1 + c1 + [9], [10]), (p1 + [99], [11])],
        "sB": [(p1, [12])],
    }
    with transaction(migrated_db) as db:
        for sid, rows in turns.items():
            db.add(SessionRow(id=sid, project_id=pid, task_id="t"))
            db.flush()
            for k, (prompt, comp) in enumerate(rows):
                db.add(InteractionRow(
                    id=f"{sid}-{k}", project_id=pid, session_id=sid, seq=k, group_id=None,
                    choice_index=0, request={"messages": []}, prompt_token_ids=prompt,
                    completion_token_ids=comp, completion_logprobs=[-0.5] * len(comp),
                    temperature=1.0, top_p=1.0, policy_version="base", finish_reason="stop",
                    output={"text": "x"}, usage={}, created_at=utcnow(), reward=0.5,
                ))  # fmt: skip
    with migrated_db() as db:
        sel = select_samples(db, pid, max_staleness=2, max_samples=100, group_by_prompt=True)
    assert {s.interaction_id: s.session_id for s in sel.samples} == {
        "sA-0": "sA", "sA-1": "sA", "sA-2": "sA", "sA-3": "sA", "sB-0": "sB"
    }  # fmt: skip
    rows = sorted([s.interaction_id for s in r] for r in chains(sel.samples))
    assert rows == [["sA-0", "sA-1", "sA-2"], ["sA-3"], ["sB-0"]]


# ---- the same numbers (real packaged model, float32 CPU) ----------------------------


@pytest.fixture(scope="module")
def model_dir():  # type: ignore[no-untyped-def]
    from engine.model_files import PACKAGED_MODEL, resolve_model_dir
    from tests.servers import MODEL_CACHE

    return resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)


def _policy(model_dir, cfg: TrainConfig):  # type: ignore[no-untyped-def]
    """The packaged model with a seeded non-zero adapter (so the shared prefix's gradient
    through the adapter matters)."""
    from trainer.policy import Policy

    policy = Policy.load(model_dir, cfg)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return policy


def _workload() -> list[Sample]:
    """Sessions of 2-4 turns; sibling sessions of one question (their first turns share
    a prompt: a GRPO group, forwarded with a shared prompt when not merged); a session
    whose third prompt does not extend its second turn; single turns."""
    rng = random.Random(11)
    question = _ids(rng, 14)
    out = [s for i in range(3) for s in session(rng, f"Q{i}", 3, prompt=question)]
    out += [s for i in range(3) for s in session(rng, f"S{i}", 2 + i)]
    broken = session(rng, "B", 3)
    broken[2].prompt_ids = broken[1].prompt_ids + [77] + broken[1].completion_ids[1:] + [5, 6]
    out += broken
    out += [s for i in range(2) for s in session(rng, f"one{i}", 1)]
    return out


def test_merged_forward_equals_per_turn_rows(model_dir) -> None:  # type: ignore[no-untyped-def]
    """Per-token logprobs, entropies and the LoRA gradient of a loss over every turn (each
    with its own advantage and temperature) are those of one row per turn."""
    cfg = TrainConfig(lora_rank=4)
    policy = _policy(model_dir, cfg)
    samples = _workload()
    merged = make_micro_batches(samples, 10_000, merge=True)
    per_turn = make_micro_batches(samples, 10_000, merge=False)
    assert sum(b.merged_turns for b in merged) == len(samples) - 3  # all but B2 and singles
    assert any(b.shares_prompts for b in per_turn)
    saved = sum(b.forward_tokens for b in per_turn) - sum(b.forward_tokens for b in merged)
    assert saved > 0
    results = []
    for batches in (merged, per_turn):
        policy.model.zero_grad(set_to_none=True)
        lps: dict[str, torch.Tensor] = {}
        ents: dict[str, torch.Tensor] = {}
        for b in batches:
            lp, ent = policy.batch_logprobs_entropy(b, True)
            assert ent is not None
            loss = sum(
                (x * s.advantage).sum() + 0.1 * e.sum()
                for x, e, s in zip(lp, ent, b.samples, strict=True)
            )
            loss.backward()  # type: ignore[union-attr]
            for s, x, e in zip(b.samples, lp, ent, strict=True):
                lps[s.interaction_id], ents[s.interaction_id] = x.detach(), e.detach()
        grad = torch.cat([p.grad.flatten() for p in policy.params])
        results.append((lps, ents, grad))
    (lp_m, ent_m, g_m), (lp_t, ent_t, g_t) = results
    for s in samples:
        assert lp_m[s.interaction_id].shape == (len(s.completion_ids),)
        torch.testing.assert_close(
            lp_m[s.interaction_id], lp_t[s.interaction_id], atol=2e-4, rtol=0
        )
        torch.testing.assert_close(
            ent_m[s.interaction_id], ent_t[s.interaction_id], atol=2e-4, rtol=0
        )
    torch.testing.assert_close(g_m, g_t, atol=1e-4, rtol=1e-3)
    assert g_m.abs().sum() > 0


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_training_steps_equal_with_and_without_merge(model_dir, aggregation: str) -> None:  # type: ignore[no-untyped-def]
    """Two PPO steps (proximal and base passes, KL, IcePop mask, stale turns, the clip on
    the second step) give the same losses, metrics and weights merged or not: the loss
    normalizes per sampled token / per turn exactly as without the merge."""
    from trainer.train import train

    cfg = TrainConfig(
        lora_rank=4,
        num_minibatches=2,
        micro_batch_tokens=4096,
        kl_coef=0.05,
        kl_prox_target=None,  # no early stop at a float-close threshold
        aggregation=aggregation,
    )
    samples = _workload()
    policy = _policy(model_dir, cfg)
    recorded = policy.logprobs(make_micro_batches(samples, 10_000))
    rng = random.Random(3)
    for s in samples:  # behaviour = proximal + noise well inside or well outside the band
        noise = torch.tensor([rng.choice([0.02, -0.02, 0.03, 1.3, -1.3]) for _ in s.completion_ids])
        s.behav_logprobs = (recorded[s.interaction_id] + noise).tolist()
    runs = []
    for merge in (True, False):
        cfg.merge_turns = merge
        policy = _policy(model_dir, cfg)
        opt = torch.optim.SGD(policy.params, lr=2.0)  # no Adam: its first step is sign(g)
        steps = train(policy, opt, samples, cfg, progress=False)
        runs.append((steps, torch.cat([p.detach().flatten() for p in policy.params])))
    (s_m, w_m), (s_t, w_t) = runs
    assert len(s_m) == len(s_t) == 2
    assert s_m[1]["ratio_mean"] != 1.0  # the second step sees the first one's update
    assert s_m[0]["masked_frac"] > 0 and s_m[0]["masked_stale_frac"] > 0
    for a, b in zip(s_m, s_t, strict=True):
        assert (a["num_seqs"], a["num_tokens"]) == (b["num_seqs"], b["num_tokens"])
        for key in ("loss", "kl", "kl_prox", "ratio_mean", "entropy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-5), key
        for key in ("clip_frac", "masked_frac", "masked_stale_frac", "masked_mismatch_frac"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key
        assert a["forward_tokens"] + a["forward_tokens_saved"] == b["forward_tokens"]
        assert b["merged_turns"] == 0 and b["forward_tokens_saved"] == 0
    assert sum(s["merged_turns"] for s in s_m) > 0
    assert s_m[0]["no_grad_forward_tokens_saved"] > 0
    # float error of two forwards, grown by one AdamW step at the default lr (1e-3 since 275df9c)
    assert (w_m - w_t).abs().max() < 5e-4 and (w_m - w_t).abs().max() < (w_m.abs().max() * 1e-2)
