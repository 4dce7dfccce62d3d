"""The demo's task: the question, the verifier, the question split and the eval gate.

"What is a + b? Reply with only the number." (a, b in 1..20) after one worked exchange;
an answer scores 1 when it is exactly the number. The questions split into disjoint
training, held-out (what the curve reports) and validation (the eval gate's) sets.
"""

from __future__ import annotations

import random
from pathlib import Path

PROMPT = "What is {a} + {b}? Reply with only the number."
# One worked exchange before the question, as an agent's prompt would carry: the base
# model then answers with a bare number about half the time (0.1% without it), so
# exactly right answers occur from the first minute and need no format credit.
EXAMPLE = (3, 4)


def messages(a: int, b: int) -> list[dict]:
    """The chat the agent sends for "a + b": the worked example, then the question."""
    x, y = EXAMPLE
    return [
        {"role": "user", "content": PROMPT.format(a=x, b=y)},
        {"role": "assistant", "content": str(x + y)},
        {"role": "user", "content": PROMPT.format(a=a, b=b)},
    ]


PROJECT = "demo"
SAMPLING_TEMPERATURE = 0.7
MAX_TOKENS = 8
GATE_SIZE = 32  # validation questions of the eval gate (2 x 32 greedy requests per publish)
# The demo project's tempo (Project.settings["training"]); everything else is the default
# of trainer/config.py. A run as soon as 8 groups of 8 that carry signal wait (the default
# threshold of 64 samples; zero-variance groups do not count), and each version is first
# measured on 8 groups of its own traffic (guard_min_samples).
TRAINING = {
    "schedule_minutes": 0.25,
    "min_samples": 32,
    "max_samples": 64,
}


def exact_match(text: str | None, expected: int) -> bool:
    """The answer is the number and nothing else (a trailing period is forgiven)."""
    return (text or "").strip().rstrip(".").strip() == str(expected)


def score(text: str | None, expected: int) -> float:
    """The verifier: 1 for exactly the number, 0 for anything else. The worked example in
    the prompt makes a bare number the base model's usual answer, so right answers occur
    from the start and need no format credit. (Any other credit was an attractor: a flat
    0.1 for a bare number let one constant wrong number collect it on every question and
    collapse the policy; closeness credit taught a typical sum ("11") to every question;
    credit for the right number inside a longer answer taught "4 + 14 = 18", never
    exactly right.)"""
    return 1.0 if exact_match(text, expected) else 0.0


Pairs = list[tuple[int, int]]


def split_pairs(
    eval_size: int, seed: int, gate_size: int = GATE_SIZE
) -> tuple[Pairs, Pairs, Pairs]:
    """(train, held-out, validation): disjoint; the held-out set is what the curve reports,
    the validation set is the eval gate's."""
    pairs = [(a, b) for a in range(1, 21) for b in range(1, 21) if (a, b) != EXAMPLE]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    held_out, validation = pairs[:eval_size], pairs[eval_size : eval_size + gate_size]
    return pairs[eval_size + gate_size :], held_out, validation


def eval_gate(model_dir: Path, validation: Pairs) -> dict:
    """The demo's eval gate (trainer/eval_gate.py): the validation questions rendered with
    the chat template as the gateway renders them, scored by ``exact_number``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = []
    for a, b in validation:
        text = tok.apply_chat_template(
            messages(a, b),
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tok.encode(text, add_special_tokens=False)
        prompts.append({"input_ids": ids, "expected": a + b})
    return {
        "enabled": True,
        "verifier": "exact_number",
        "prompts": prompts,
        "max_new_tokens": MAX_TOKENS,
        "margin": 0.125,  # 2 questions in 32 on the [-1, 1] scale: greedy noise
    }
