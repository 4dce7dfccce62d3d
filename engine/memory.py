"""What the embedded engine can hold at most, and the bound an operator puts on it
(``--max-memory-gb``).

The weights are resident from the start; the KV cache is reserved for every slot at the
full context and takes memory as positions are written (engine/llama.py ``lazy_zeros``);
each loaded adapter is stored at its own rank, at most ``--max-lora-rank``. The bound is
checked against the worst case (every slot full, ``--max-loaded-loras`` adapters at the
largest rank) before anything is allocated, so it holds whatever the traffic does: a
configuration over it does not start, and the message says what fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.llama import LlamaConfig
from engine.projections import PROJECTIONS

GB = 1e9


class MemoryBoundError(ValueError):
    """The configuration could use more memory than ``--max-memory-gb``."""


@dataclass(frozen=True)
class MemoryPlan:
    """The most each part can take, in bytes."""

    weights: int
    kv_per_token: int  # keys and values of one position, every layer
    slots: int  # running + prefix-cache slots
    context: int
    adapter: int  # one adapter at the largest rank
    adapters: int  # how many can be loaded at once

    @property
    def kv(self) -> int:
        return self.slots * self.context * self.kv_per_token

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.adapters * self.adapter

    def describe(self) -> str:
        return (
            f"{self.total / GB:.2f} GB at most: weights {self.weights / GB:.2f} GB + KV cache "
            f"{self.kv / GB:.2f} GB ({self.slots} slots x {self.context} tokens x "
            f"{self.kv_per_token / 1024:.0f} KB) + adapters {self.adapters * self.adapter / GB:.2f}"
            f" GB ({self.adapters} x {self.adapter / GB * 1000:.0f} MB)"
        )

    def check(self, limit_gb: float | None, spare_slots: int) -> None:
        """MemoryBoundError naming what fits when the worst case is over ``limit_gb``."""
        if limit_gb is None or self.total <= limit_gb * GB:
            return
        room = limit_gb * GB - self.weights - self.adapters * self.adapter
        per_slot = self.context * self.kv_per_token
        slots = int(room // per_slot) - spare_slots if room > 0 else 0
        context = int(room // (self.slots * self.kv_per_token)) if room > 0 else 0
        fits = []
        if slots >= 1:
            fits.append(f"--max-running-requests {slots}")
        if context >= 256:
            fits.append(f"--context-length {context}")
        hint = (
            f"; at most {' or '.join(fits)} fits"
            if fits
            else "; the weights and adapters alone do not fit: lower --max-loaded-loras or "
            "--max-lora-rank, or raise the bound"
        )
        raise MemoryBoundError(
            f"this configuration could use {self.describe()}, over --max-memory-gb "
            f"{limit_gb:g}{hint}"
        )


def plan(
    cfg: LlamaConfig,
    dtype: torch.dtype,
    *,
    slots: int,
    context: int,
    max_rank: int,
    max_adapters: int,
    modules: frozenset[str],
) -> MemoryPlan:
    """The worst case of a configuration, from the model's config alone (nothing loaded)."""
    width = torch.empty((), dtype=dtype).element_size()
    projections = sum(o * i for o, i in map(cfg.module_shape, PROJECTIONS))
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    weights = (cfg.num_layers * projections + embeddings + norms) * width
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * width
    per_layer = sum(sum(cfg.module_shape(m)) for m in modules)  # A (r x in) + B (out x r)
    adapter = cfg.num_layers * per_layer * max_rank * width
    return MemoryPlan(weights, kv_per_token, slots, context, adapter, max_adapters)
