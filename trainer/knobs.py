"""A training knob is declared once: ``knob(default, help=..., bounds=... | choices=... |
rule=...)`` is a dataclass field whose metadata carries its allowed values and its help.

The loss's knobs are fields of ``LossConfig`` (trainer/loss.py), every other knob a field of
``TrainConfig`` (trainer/config.py), which inherits ``LossConfig``. Everything else is
derived from these fields: the range check of the admin API and of every run
(``trainer.config.BOUNDS`` and ``CHOICES``), the snapshot a run stores, and the settings
table of docs/trainer.md (:func:`knob_table`; tests/trainer/test_config_bounds.py checks
that the page holds exactly that table). Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, Field, field, fields
from typing import Any

Bounds = tuple[float, float]


def knob(
    default: Any = MISSING,
    *,
    help: str,
    bounds: Bounds | None = None,
    choices: tuple[str, ...] | None = None,
    rule: str | None = None,
    factory: Any = None,
) -> Any:
    """One setting: its default (or ``factory`` for a list or dict), what it does, and what
    values it takes: ``bounds`` (min, max) inclusive for a number, ``choices`` for text, or
    ``rule`` (how its own check reads, for the table) for anything else. A bool needs
    none of them."""
    meta = {"help": help, "bounds": bounds, "choices": choices, "rule": rule}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def bounds_of(cls: type) -> dict[str, Bounds]:
    """Each number knob's (min, max), both ends inclusive."""
    return {f.name: f.metadata["bounds"] for f in fields(cls) if f.metadata.get("bounds")}


def choices_of(cls: type) -> dict[str, tuple[str, ...]]:
    return {f.name: f.metadata["choices"] for f in fields(cls) if f.metadata.get("choices")}


def default_of(f: Field[Any]) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def _num(x: float) -> str:
    if isinstance(x, int) and x >= 2**31 - 1:
        return "2^31-1"
    return str(x) if isinstance(x, int) else f"{x:g}"


def allowed_text(f: Field[Any]) -> str:
    """What the knob takes, as the table says it."""
    meta = f.metadata
    if meta.get("bounds"):
        lo, hi = meta["bounds"]
        text = f"{_num(lo)} .. {_num(hi)}"
        return text + " or null" if str(f.type).endswith("| None") else text
    if meta.get("choices"):
        return ", ".join(f"`{c}`" for c in meta["choices"])
    if meta.get("rule"):
        return str(meta["rule"])
    return "`true` / `false`"


def knob_table(cls: type) -> str:
    """The markdown table of ``cls``'s knobs (docs/trainer.md holds it verbatim)."""
    lines = ["| setting | default | allowed | what it does |", "|---|---|---|---|"]
    for f in fields(cls):
        default = json.dumps(default_of(f))
        lines.append(
            f"| `{f.name}` | `{default}` | {allowed_text(f)} | {f.metadata.get('help', '')} |"
        )
    return "\n".join(lines) + "\n"
