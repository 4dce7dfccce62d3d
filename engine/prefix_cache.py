"""Prefix reuse: the keys/values a new prompt can copy instead of computing them again.

Donors are the running sequences (the ``n`` samples of a request, prompts sharing a
system prompt) and a few finished ones kept in spare KV slots (the next call of an agent,
whose prompt extends the previous prompt + answer). A donor must use the same adapter
object: keys/values depend on the adapter. At least the prompt's last token is always
recomputed, because its logits give the first sampled token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.llama import KVCache
from engine.lora import LoraAdapter


class Seq(Protocol):
    """What prefix reuse needs of a scheduler request."""

    input_ids: list[int]
    output_ids: list[int]
    adapter: LoraAdapter | None
    slot: int
    cached_tokens: int


def held(seq: Seq) -> list[int]:
    """The tokens whose keys/values ``seq``'s slot holds (once prefilled): the prompt and
    every sampled token but the last, which is fed back only at the next decode step."""
    return seq.input_ids + seq.output_ids[:-1]


@dataclass(eq=False)
class Retired:
    """A finished sequence whose keys/values are kept in a spare slot."""

    tokens: list[int]  # the positions its slot holds
    slot: int
    adapter: LoraAdapter | None
    used: float = field(default_factory=time.monotonic)


Donor = Seq | Retired


def longest_prefix(seq: Seq, others: Sequence[Donor]) -> tuple[int, Donor | None]:
    """The longest prefix of ``seq``'s prompt (all but its last token) that one of
    ``others`` with the same adapter holds or, not prefilled yet, will hold."""
    best, donor = 0, None
    limit = len(seq.input_ids) - 1
    for other in others:
        if other is seq or other.adapter is not seq.adapter:
            continue
        tokens = other.tokens if isinstance(other, Retired) else held(other)
        n = 0
        for a, b in zip(seq.input_ids[:limit], tokens, strict=False):
            if a != b:
                break
            n += 1
        if n > best:
            best, donor = n, other
    return best, donor


class PrefixCache:
    """Donor lookup and copies on ``cache``, whose slots ``first_spare`` and up keep up to
    ``spare_slots`` finished sequences (least recently used goes first)."""

    def __init__(self, cache: KVCache, first_spare: int, spare_slots: int) -> None:
        self.cache = cache
        self.spare_slots = spare_slots
        self.retired: list[Retired] = []
        self._free = list(range(first_spare, first_spare + spare_slots))
        self.reused_tokens = 0

    def best_donor(self, seq: Seq, running: Sequence[Seq]) -> tuple[int, Donor | None]:
        """The running (already prefilled) or retired sequence sharing the longest prefix
        with ``seq``'s prompt; a running one wins a tie."""
        found = longest_prefix(seq, [r for r in running if r.output_ids])
        kept = longest_prefix(seq, self.retired)
        return max(found, kept, key=lambda f: f[0])

    def copy(self, seq: Seq, n: int, donor: Donor) -> None:
        """Copy the donor's first ``n`` cached positions into ``seq``'s slot."""
        if isinstance(donor, Retired):
            donor.used = time.monotonic()
        self.cache.move(donor.slot, seq.slot, n)
        seq.cached_tokens = n
        self.reused_tokens += n

    def retire(self, seq: Seq) -> None:
        """Keep a finished sequence's keys/values in a spare slot, unless a kept one already
        holds them; a kept one it extends (the conversation's previous turn) makes room."""
        if not self.spare_slots:
            return
        tokens = held(seq)
        for kept in self.retired:
            if kept.adapter is seq.adapter and kept.tokens[: len(tokens)] == tokens:
                kept.used = time.monotonic()
                return  # nothing new
        extended = [
            k
            for k in self.retired
            if k.adapter is seq.adapter and tokens[: len(k.tokens)] == k.tokens
        ]
        if extended:
            victim = extended[0]
        elif self._free:
            victim = None
        else:
            victim = min(self.retired, key=lambda k: k.used)
        if victim is None:
            slot = self._free.pop()
        else:
            self.retired.remove(victim)
            slot = victim.slot
        self.cache.move(seq.slot, slot, len(tokens))
        self.retired.append(Retired(tokens, slot, seq.adapter))
