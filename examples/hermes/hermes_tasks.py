"""The Hermes example's tasks and its simulated user: sums, products and unit conversions,
rated 1-5 stars from the last number of the final answer (and whether a tool was used)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from trainer.verifiers import last_number  # the project's own number reader


@dataclass(frozen=True)
class Task:
    kind: str  # "add", "mul" or "convert"; the session's task_id (per-task baselines)
    prompt: str
    expected: float
    rel_tol: float = 0.0  # arithmetic must be exact; conversions may be rounded


_CONVERSIONS: list[tuple[str, str, float]] = [
    ("miles", "km", 1.609344),
    ("km", "miles", 1 / 1.609344),
    ("kg", "pounds", 1 / 0.45359237),
    ("pounds", "kg", 0.45359237),
    ("feet", "meters", 0.3048),
    ("inches", "cm", 2.54),
    ("gallons", "liters", 3.785411784),
]


def make_task(rng: random.Random) -> Task:
    kind = rng.choice(["add", "mul", "convert"])
    if kind == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        return Task("add", f"What is {a} + {b}?", float(a + b))
    if kind == "mul":
        a, b = rng.randint(11, 49), rng.randint(11, 49)
        return Task("mul", f"What is {a} * {b}?", float(a * b))
    src, dst, factor = rng.choice(_CONVERSIONS)
    value = rng.randint(2, 40)
    if rng.random() < 0.25:
        prompt = f"Convert {value} degrees Celsius to Fahrenheit."
        return Task("convert", prompt, value * 1.8 + 32, rel_tol=5e-3)
    return Task("convert", f"Convert {value} {src} to {dst}.", value * factor, rel_tol=5e-3)


def matches(got: float | None, task: Task) -> bool:
    """Exact for arithmetic; a conversion may be rounded (0.5 %, e.g. 19.3 for 19.312)."""
    return got is not None and math.isclose(got, task.expected, rel_tol=task.rel_tol, abs_tol=1e-9)


def rate(answer: str, task: Task, used_tool: bool) -> tuple[int, str]:
    """The simulated user's 1-5 stars and comment. It reads the final answer (the last
    number in it) and, like a user watching the agent, sees whether a tool was used."""
    got = last_number(answer)
    if matches(got, task):
        return 5, "correct"
    if used_tool:
        return 3, "used a tool, wrong answer"
    if got is not None:
        return 2, "wrong number"
    return 1, "no answer"


def stars_to_reward(stars: float) -> float:
    return (stars - 3) / 2  # the gateway's stars-5 normalization
