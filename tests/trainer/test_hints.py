"""A rating's words as a hint (trainer/hints.py, trainer/loss.py token_advantages).

- the token advantages on a constructed example, with the real packaged model as the
  teacher: the hint "Answer in one short sentence." makes ending after the first sentence
  likelier, so the end-of-turn token after it gets a positive advantage and a token that
  goes on gets a negative one;
- the combined loss equals the scalar loss when the hint weight is 0;
- the distillation term (the KL over the hinted teacher's likeliest next tokens): zero
  where teacher and policy agree, and, with the real model, it teaches the token the answer
  never sampled (ending after the first sentence), which the token advantage cannot;
- a hint that is whitespace only, too long, or that cannot be placed is refused with its
  reason;
- where hints come from (a comment on the answer, on its session, the user's next message
  read as a correction), and a run records the hint its teacher saw.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core.db import transaction
from core.keys import new_id
from engine.model_files import PACKAGED_MODEL, resolve_model_dir
from schemas.coltypes import utcnow
from schemas.tables import (
    FeedbackRow,
    InteractionRow,
    RunHintRow,
    SessionRow,
    TrainingRunRow,
)
from tests.servers import MODEL_CACHE
from tests.trainer.helpers import _tokenizer, make_project, render
from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.forward import make_micro_batches
from trainer.hints import MAX_HINT_CHARS, Placer, attach, clean, find_hints
from trainer.loss import LossConfig, ppo_loss, token_advantages, topk_kl
from trainer.train import hint_teacher_scores, train

HINT = "Answer in one short sentence."
QUESTION = "What is a volcano?"


def _sample(iid: str, prompt: list[int], completion: list[int], hinted: list[int] | None):
    return Sample(
        interaction_id=iid,
        prompt_ids=prompt,
        completion_ids=completion,
        behav_logprobs=[0.0] * len(completion),
        temperature=1.0,
        reward=-1.0,
        group_key=iid,
        baseline_key="t",
        hinted_prompt=hinted,
    )


# ---- the teacher on a constructed example (real model) -------------------------------------


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    from trainer.policy import Policy

    return Policy.load(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE), TrainConfig(lora_rank=4))


@pytest.mark.slow
@pytest.mark.parametrize("teacher", ["base", "policy"])
def test_the_hint_moves_the_tokens_it_speaks_about(policy, teacher: str) -> None:  # type: ignore[no-untyped-def]
    tok = _tokenizer()
    prompt = render(QUESTION)
    hinted, reason = Placer(tok).place(prompt, HINT)
    assert reason is None and hinted is not None
    first = tok.encode("A volcano is a mountain that erupts lava.", add_special_tokens=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    more = tok.encode(" It is formed when magma rises", add_special_tokens=False)
    short = _sample("short", prompt, [*first, end], hinted)
    long = _sample("long", prompt, [*first, *more], hinted)
    cfg = TrainConfig(lora_rank=4, hint_teacher=teacher)
    with_hint = {k: v.logp for k, v in hint_teacher_scores(policy, [short, long], cfg).items()}
    without = policy.logprobs(make_micro_batches([short, long], 4096), adapter=True)
    gap_end = float(with_hint["short"][-1] - without["short"][-1])
    gap_more = float(with_hint["long"][len(first)] - without["long"][len(first)])
    # ending after the first sentence: much likelier with the hint (a log-ratio > 1);
    # going on with a second sentence: unlikelier
    assert gap_end > 1.0, gap_end
    assert gap_more < 0.0, gap_more
    adv = token_advantages(
        torch.tensor([0.0, 0.0]),
        torch.ones(2, len(first) + len(more), dtype=torch.bool),
        cfg,
        torch.nn.utils.rnn.pad_sequence([with_hint["short"], with_hint["long"]], batch_first=True),
        torch.nn.utils.rnn.pad_sequence([without["short"], without["long"]], batch_first=True),
        torch.tensor([True, True]),
    )
    assert float(adv[0, len(first)]) == pytest.approx(min(gap_end, cfg.hint_clip))
    assert float(adv[1, len(first)]) == pytest.approx(max(gap_more, -cfg.hint_clip))


def test_hint_weight_zero_is_the_scalar_loss() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g) - 2
    prox = logp + 0.05 * torch.randn(3, 5, generator=g)
    behav = prox + 0.05 * torch.randn(3, 5, generator=g)
    teacher = prox + torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    adv = torch.tensor([0.7, -0.4, 1.2])
    scalar, _ = ppo_loss(logp, prox, behav, adv, mask, LossConfig())
    off = LossConfig(hint_weight=0.0)
    combined = token_advantages(adv, mask, off, teacher, prox, torch.tensor([True, False, True]))
    loss, _ = ppo_loss(logp, prox, behav, combined, mask, off)
    assert float(loss) == pytest.approx(float(scalar), abs=1e-7)
    # and with weight: the hinted rows move, the unhinted one is the scalar advantage
    on = LossConfig(hint_weight=0.5, reward_weight=2.0, hint_clip=0.3)
    combined = token_advantages(adv, mask, on, teacher, prox, torch.tensor([True, False, True]))
    want0 = 2.0 * adv[0] + 0.5 * (teacher[0] - prox[0]).clamp(-0.3, 0.3)
    assert torch.allclose(combined[0], want0)
    assert torch.allclose(combined[1], torch.full((5,), 2.0 * float(adv[1])))
    assert torch.allclose(combined[2, 3:], torch.full((2,), 2.0 * float(adv[2])))  # padding
    loss_on, _ = ppo_loss(logp, prox, behav, combined, mask, on)
    assert float(loss_on) != pytest.approx(float(scalar))


def test_topk_kl_is_zero_where_teacher_and_policy_agree() -> None:
    g = torch.Generator().manual_seed(0)
    teacher = torch.log_softmax(torch.randn(4, 50, generator=g), -1)
    top = teacher.topk(8, dim=-1)
    assert torch.allclose(topk_kl(top.values, top.values), torch.zeros(4), atol=1e-6)
    # the policy lower on the teacher's first choice: a positive KL, and its gradient
    # raises that token
    student = torch.log_softmax(torch.randn(4, 50, generator=g), -1).requires_grad_()
    kl = topk_kl(top.values, student.gather(-1, top.indices))
    assert bool((kl > 0).all())
    kl.sum().backward()
    first = student.grad.gather(-1, top.indices[:, :1])  # type: ignore[union-attr]
    assert bool((first < 0).all())  # descent on the KL raises the teacher's likeliest token
    # weight 0: the loss is the scalar loss, whatever the KL
    mask = torch.ones(4, 3, dtype=torch.bool)
    logp = torch.randn(4, 3, generator=g) - 2
    adv = torch.tensor([0.5, -1.0, 0.2, 0.0])
    cfg = LossConfig(distill_weight=0.0)
    scalar, _ = ppo_loss(logp, logp, logp, adv, mask, cfg)
    dkl = torch.rand(4, 3, generator=g)
    off, m = ppo_loss(logp, logp, logp, adv, mask, cfg, distill=dkl)
    assert float(off) == pytest.approx(float(scalar), abs=1e-7)
    assert m["distill_kl"] == pytest.approx(float(dkl.mean()))
    on, _ = ppo_loss(logp, logp, logp, adv, mask, LossConfig(distill_weight=0.5), distill=dkl)
    assert float(on) == pytest.approx(float(scalar) + 0.5 * float(dkl.mean()), abs=1e-6)


@pytest.mark.slow
def test_distillation_teaches_the_end_the_answer_never_sampled() -> None:
    """The long answer went on after its first sentence; the hint asks for one sentence.
    Its token advantage can only push down the token it sampled there (" It"); the
    distillation term raises the end-of-turn token at that position, which it never
    sampled. Steps on that term alone (no reward, no token advantage, no KL to the base)."""
    from trainer.policy import Policy

    tok = _tokenizer()
    prompt = render(QUESTION)
    hinted, _ = Placer(tok).place(prompt, HINT)
    first = tok.encode("A volcano is a mountain that erupts lava.", add_special_tokens=False)
    more = tok.encode(" It is formed when magma rises", add_special_tokens=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    long = _sample("long", prompt, [*first, *more], hinted)
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    cfg = TrainConfig(
        lora_rank=4,
        reward_weight=0.0,
        hint_weight=0.0,
        kl_coef=0.0,
        distill_weight=1.0,
        distill_topk=16,
        kl_prox_target=None,
        epochs=4,
        num_minibatches=1,
    )
    policy = Policy.load(model_dir, cfg)

    def p_end() -> float:
        h = policy.hidden(make_micro_batches([long], 4096)[0])
        out = policy.head(h, [long], None, [torch.full((len(long.completion_ids), 1), end)])
        return float(out.at[0][len(first), 0].exp())  # type: ignore[index]

    with torch.no_grad():
        before = p_end()
    teacher = hint_teacher_scores(policy, [long], cfg)["long"]
    assert int(end) in teacher.top_index[len(first)].tolist()  # the teacher would end here
    steps = train(policy, policy.make_optimizer(cfg, None), [long], cfg, progress=False)
    assert len(steps) == 4 and steps[0]["distill_kl"] > 0
    assert steps[-1]["distill_kl"] < steps[0]["distill_kl"]
    with torch.no_grad():
        after = p_end()
    assert before < 0.01 and after > 0.5, (before, after)  # the teacher: about 0.9


@pytest.mark.slow
def test_a_run_without_hints_is_the_same_with_or_without_distillation() -> None:
    """Thumbs only: no teacher pass, no distillation term, so the run's steps are the same
    whatever ``distill_weight`` says (the learning benchmark's thumbs variant is untouched)."""
    from trainer.policy import Policy

    tok = _tokenizer()
    prompt = render(QUESTION)
    answers = ["A volcano is a mountain that erupts lava.", "It is a hill. It can be hot."]
    samples = [
        replace(
            _sample(f"s{i}", prompt, tok.encode(a, add_special_tokens=False), None),
            advantage=(1.0 if i == 0 else -1.0),
        )
        for i, a in enumerate(answers)
    ]
    model_dir = resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)
    runs = []
    for weight in (0.0, 1.0):
        cfg = TrainConfig(lora_rank=4, distill_weight=weight, epochs=2, num_minibatches=1)
        policy = Policy.load(model_dir, cfg)
        runs.append(train(policy, policy.make_optimizer(cfg, None), samples, cfg, progress=False))
    keys = ("loss", "kl", "kl_prox", "grad_norm", "distill_kl")
    assert [[s[k] for k in keys] for s in runs[0]] == [[s[k] for k in keys] for s in runs[1]]
    assert all(s["distill_kl"] == 0.0 for s in runs[1])


# ---- refused hints ----------------------------------------------------------------------------


def test_empty_long_and_unplaceable_hints_are_refused_with_a_reason() -> None:
    assert clean("  \n\t ") == (None, "hint_empty")
    assert clean(None) == (None, "hint_empty")
    assert clean("x" * (MAX_HINT_CHARS + 1)) == (None, "hint_too_long")
    assert clean("  Shorter, please. ") == ("Shorter, please.", None)
    placer = Placer(_tokenizer())
    prompt = render(QUESTION)
    # within the character limit, over the token limit
    assert placer.place(prompt, "\u4e00" * (MAX_HINT_CHARS - 1)) == (None, "hint_too_long")
    # a prompt that does not end with the template's generation suffix (a raw completion)
    assert placer.place(prompt[:-3], HINT) == (None, "hint_unplaceable")
    hinted, _ = placer.place(prompt, HINT)
    assert hinted is not None
    text = _tokenizer().decode(hinted)
    assert text.endswith(f"{QUESTION}\n\n{HINT}<|im_end|>\n<|im_start|>assistant\n")


# ---- where hints come from, and the run's record ----------------------------------------


def _turn(db, pid: str, sid: str, seq: int, request: dict, prompt: list[int]) -> str:  # type: ignore[no-untyped-def]
    iid = new_id("int")
    db.add(
        InteractionRow(
            id=iid,
            project_id=pid,
            session_id=sid,
            seq=seq,
            request=request,
            output={},
            usage={},
            top_p=1.0,
            prompt_token_ids=prompt,
            completion_token_ids=[1, 2],
            completion_logprobs=[-0.5, -0.5],
            policy_version="base",
            temperature=1.0,
            finish_reason="stop",
            reward=-1.0,
            created_at=utcnow(),
        )
    )
    return iid


def _rating(db, pid: str, target_type: str, target: str, **kw) -> None:  # type: ignore[no-untyped-def]
    db.add(
        FeedbackRow(
            id=new_id("fb"),
            project_id=pid,
            target_type=target_type,
            target_id=target,
            value=kw.pop("value", False),
            scale="binary",
            reward=kw.pop("reward", -1.0),
            created_at=utcnow(),
            **kw,
        )
    )


def test_hints_from_comments_sessions_and_next_messages(migrated_db) -> None:  # type: ignore[no-untyped-def]
    factory = migrated_db
    pid = make_project(factory, {})
    prompt = render(QUESTION)
    q = {"messages": [{"role": "user", "content": QUESTION}]}
    with transaction(factory) as db:
        for sid in ("s1", "s2", "s3", "s4"):
            db.add(SessionRow(id=f"{pid}-{sid}", project_id=pid, status="open"))
        db.flush()
        a = _turn(db, pid, f"{pid}-s1", 1, q, prompt)
        b = _turn(db, pid, f"{pid}-s2", 1, q, prompt)
        c = _turn(db, pid, f"{pid}-s3", 1, q, prompt)
        follow = {
            "messages": [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "A long answer."},
                {"role": "user", "content": "No, too long. One sentence please."},
            ]
        }
        _turn(db, pid, f"{pid}-s3", 2, follow, prompt)
        d = _turn(db, pid, f"{pid}-s4", 1, q, prompt)
        _rating(db, pid, "interaction", a, comment="Too long.", source="user")
        _rating(db, pid, "session", f"{pid}-s2", comment=HINT, source="user")
        _rating(db, pid, "interaction", c, source="next_turn", rater="rules:next_turn")
        _rating(db, pid, "interaction", d, comment="   ", source="user")
    with factory() as db:
        rows = [db.get(InteractionRow, i) for i in (a, b, c, d)]
        hints, skipped = find_hints(db, rows)
    assert {k: (h.origin, h.text) for k, h in hints.items()} == {
        a: ("comment", "Too long."),
        b: ("comment", HINT),
        c: ("next_message", "No, too long. One sentence please."),
    }
    assert skipped == Counter({"hint_empty": 1})
    samples = [_sample(i, prompt, [1, 2], None) for i in (a, b, c, d)]
    with factory() as db:
        used, refused = attach(db, samples, Placer(_tokenizer()))
    assert sorted(h.interaction_id for h in used) == sorted([a, b, c])
    assert [s.hinted_prompt is not None for s in samples] == [True, True, True, False]
    assert refused == Counter({"hint_empty": 1})


@pytest.mark.slow
def test_a_run_records_the_hint_its_teacher_saw(migrated_db, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from core.settings import get_settings
    from trainer.runner import run_training

    monkeypatch.setenv("RLGATE_MODEL_PATH", str(resolve_model_dir(PACKAGED_MODEL, MODEL_CACHE)))
    get_settings.cache_clear()
    factory = migrated_db
    pid = make_project(factory, {"lora_rank": 4, "guards": False})
    tok = _tokenizer()
    prompt = render(QUESTION)
    completion = tok.encode("A volcano is a mountain.", add_special_tokens=False)
    with transaction(factory) as db:
        db.add(SessionRow(id=f"{pid}-s", project_id=pid, status="open"))
        db.flush()
        iid = _turn(db, pid, f"{pid}-s", 1, {"messages": []}, prompt)
        row = db.get(InteractionRow, iid)
        row.completion_token_ids = completion
        row.completion_logprobs = [-1.0] * len(completion)
        _rating(db, pid, "interaction", iid, comment=HINT, source="user")
    run_training(pid, settings=get_settings(), factory=factory)  # no engine: not published
    with factory() as db:
        run = db.query(TrainingRunRow).one()
        hints = db.query(RunHintRow).all()
    assert run.config["data_stats"]["hints"] == 1, run.config
    assert run.config["data_stats"]["run_metrics"]["hint_adv_mean"] is not None
    assert [(h.interaction_id, h.origin, h.text, h.teacher) for h in hints] == [
        (iid, "comment", HINT, TrainConfig().hint_teacher)
    ]
    assert hints[0].adv_mean is not None
