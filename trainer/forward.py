"""Micro-batches and their forward: which tokens run through the decoder, once each.

A micro-batch is a list of rows: one row per sample, or one per chain of turns merged by
trainer/merge.py (the chain's last turn holds the others as a prefix); a row's sequence
is its last sample's prompt + completion. Three kinds of sharing cut the tokens forwarded:

- Merged chains (trainer/merge.py): a session's turns are one row.
- Identical prompts (a GRPO group, rows of one sample each): each distinct prompt is
  forwarded once and its KV cache is repeated for the completions that follow it.
- A cross-row shared prefix: the longest common token prefix P of all the rows'
  sequences (a system prompt, tool specs, few-shot examples), capped so that every
  position predicting a sampled token lies after it (``len(P) <= len(prompt_ids) - 1``
  for every sample). When ``len(P) >= min_prefix`` (default 16) and there are two rows
  or more, P is forwarded once with batch size 1; its KV cache is expanded to the rows
  (``reorder_cache`` with a zeros index: an index_select, so P's positions get the
  gradient of every row) and the rows' remainders (or, with identical prompts, the
  distinct prompts' remainders, then the completions) run on it with positions from
  ``len(P)``. The batch takes whichever path (padded rows or shared prompts, both on P)
  computes fewer tokens; without a worthwhile P it forwards exactly as before.

Causal attention makes every position's hidden state the same whichever way it is
computed, so the logprobs and the gradient do not change (tests/trainer/
test_shared_prefix.py, test_micro_batches.py, test_prefix_merge.py). The LM head runs only
at the positions that predict sampled tokens (trainer/policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from trainer.data import Sample
from trainer.merge import chains, merged_turns

MIN_SHARED_PREFIX = 16  # tokens; a shorter common prefix is not worth a forward of its own


def _seq(row: list[Sample]) -> list[int]:
    return row[-1].prompt_ids + row[-1].completion_ids


def _lcp(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = max(0, min(len(a), len(b), limit))
    if a[:n] == b[:n]:  # the common case for a shared system prompt: one C-level compare
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _Shape:
    """What a batch's forward costs, kept incrementally as units are added (packing stays
    linear in the tokens compared, not quadratic in the rows)."""

    def __init__(self, min_prefix: int) -> None:
        self.min_prefix = min_prefix
        self.rows = 0
        self.samples = 0
        self.merged = False
        self.width = 0  # longest row
        self.ref: list[int] | None = None  # the first row's sequence
        self.lcp = 0  # common prefix of all rows' sequences, capped below
        self.cap = 0  # min over samples of len(prompt_ids) - 1
        self.prompts: dict[tuple[int, ...], int] = {}  # distinct prompt -> its length
        self.longest_prompt = 0
        self.longest_completion = 0
        self.completion_tokens = 0
        self.row_tokens = 0

    def copy(self) -> _Shape:
        new = _Shape.__new__(_Shape)
        new.__dict__.update(self.__dict__)
        new.prompts = dict(self.prompts)
        return new

    def add(self, rows: list[list[Sample]]) -> _Shape:
        for row in rows:
            seq = _seq(row)
            cap = min(len(s.prompt_ids) for s in row) - 1
            if self.ref is None:
                self.ref, self.lcp, self.cap = seq, len(seq), cap
            else:
                self.cap = min(self.cap, cap)
                self.lcp = _lcp(self.ref, seq, min(self.lcp, self.cap))
            self.rows += 1
            self.samples += len(row)
            self.merged |= len(row) > 1
            self.width = max(self.width, len(seq))
            self.row_tokens += len(seq)
            for s in row:
                self.prompts.setdefault(tuple(s.prompt_ids), len(s.prompt_ids))
                self.longest_prompt = max(self.longest_prompt, len(s.prompt_ids))
                self.longest_completion = max(self.longest_completion, len(s.completion_ids))
                self.completion_tokens += len(s.completion_ids)
        return self

    @property
    def prefix(self) -> int:
        """Tokens of the cross-row shared prefix to forward once (0: none)."""
        p = max(0, min(self.lcp, self.cap))
        return p if self.rows >= 2 and p >= max(1, self.min_prefix) else 0

    @property
    def can_share_prompts(self) -> bool:
        return not self.merged and len(self.prompts) < self.samples

    def padded_cost(self) -> int:
        p = self.prefix
        return p + self.rows * (self.width - p)

    def shared_cost(self) -> int:
        p = self.prefix
        return (
            p
            + len(self.prompts) * (self.longest_prompt - p)
            + self.samples * self.longest_completion
        )

    @property
    def shares_prompts(self) -> bool:
        """The identical-prompt path: always when prompts repeat and there is no shared
        prefix (as before it), otherwise when it computes fewer tokens."""
        if not self.can_share_prompts:
            return False
        return not self.prefix or self.shared_cost() < self.padded_cost()

    def cost(self) -> int:
        return self.shared_cost() if self.shares_prompts else self.padded_cost()

    def forward_tokens(self) -> int:
        p = self.prefix
        if self.shares_prompts:
            distinct = sum(self.prompts.values()) - len(self.prompts) * p
            return p + distinct + self.completion_tokens
        return p + self.row_tokens - self.rows * p


@dataclass
class MicroBatch:
    """Samples forwarded together, as ``rows``: one row per sample, or one row per chain
    of turns merged by trainer/merge.py (the chain's last turn holds the others as a
    prefix). ``samples`` is the rows' samples in order; logprobs come back in that order.
    ``prefix`` tokens common to every row are forwarded once; samples that share a prompt
    (a GRPO group, rows of one sample each) may share its forward (module docstring)."""

    samples: list[Sample]
    rows: list[list[Sample]] = field(default_factory=list)
    min_prefix: int = MIN_SHARED_PREFIX

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [[s] for s in self.samples]
        flat = [s for r in self.rows for s in r]
        assert len(flat) == len(self.samples)
        assert all(a is b for a, b in zip(flat, self.samples, strict=True))

    @classmethod
    def of_rows(cls, rows: list[list[Sample]], min_prefix: int = MIN_SHARED_PREFIX) -> MicroBatch:
        return cls([s for r in rows for s in r], rows, min_prefix)

    @cached_property
    def shape(self) -> _Shape:
        return _Shape(self.min_prefix).add(self.rows)

    @property
    def tokens(self) -> int:
        """Tokens of the samples (each turn's prompt + completion)."""
        return sum(s.length for s in self.samples)

    @property
    def forward_tokens(self) -> int:
        """Tokens the forward computes, padding aside: the shared prefix once, a shared
        prompt once, a merged row once."""
        return self.shape.forward_tokens()

    @property
    def padded_tokens(self) -> int:
        return self.shape.cost()

    @property
    def prefix(self) -> int:
        return self.shape.prefix

    @property
    def merged_turns(self) -> int:
        return merged_turns(self.rows)

    @property
    def shares_prompts(self) -> bool:
        return self.shape.shares_prompts


def _cost(rows: list[list[Sample]], min_prefix: int = MIN_SHARED_PREFIX) -> int:
    """Tokens a forward computes, padding included: the shared prefix once, then one
    padded row per distinct prompt's remainder and one per completion (identical-prompt
    path), or one padded remainder per sample or merged chain, whichever is less."""
    return _Shape(min_prefix).add(rows).cost()


def make_micro_batches(
    samples: list[Sample], budget: int, merge: bool = False, min_prefix: int = MIN_SHARED_PREFIX
) -> list[MicroBatch]:
    """Samples with the same prompt stay together, and so do (with ``merge``) the turns of
    a session merged into one row (trainer/merge.py); these units go longest first into
    batches while the batch's forward (:func:`_cost`, counting a shared prefix once) stays
    within ``budget`` tokens (a unit over the budget gets a batch of its own). A merged row
    is as long as its last turn's own row. ``min_prefix`` is the shortest cross-row
    prefix worth forwarding once (a huge value turns it off)."""
    rows = chains(samples) if merge else [[s] for s in samples]
    groups: dict[tuple[int, ...], list[list[Sample]]] = {}
    merged: list[list[list[Sample]]] = []
    for row in rows:
        if len(row) > 1:
            merged.append([row])
        else:
            groups.setdefault(tuple(row[0].prompt_ids), []).append(row)
    units = list(groups.values()) + merged
    ordered = sorted(units, key=lambda u: max(r[-1].length for r in u), reverse=True)
    batches: list[tuple[list[list[Sample]], _Shape]] = []
    for unit in ordered:
        if batches:
            grown = batches[-1][1].copy().add(unit)
            if grown.cost() <= budget:
                batches[-1][0].extend(unit)
                batches[-1] = (batches[-1][0], grown)
                continue
        batches.append((list(unit), _Shape(min_prefix).add(unit)))
    return [MicroBatch.of_rows(b, min_prefix) for b, _ in batches]


# ---- the forward -------------------------------------------------------------------


def _extend(
    decoder: Any,
    cache: Any,
    past: torch.Tensor,
    seqs: list[list[int]],
    starts: list[int],
    dev: torch.device,
) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """Forward right-padded ``seqs`` (row r at positions ``starts[r]``...) on ``cache``
    (None, or one row per seq) whose attention mask is ``past`` [rows, cached]. Returns
    the hidden states [rows, width, d], the cache and the attention mask so far."""
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    att = torch.zeros(len(seqs), width, dtype=torch.long)
    pos = torch.zeros(len(seqs), width, dtype=torch.long)
    for r, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
        ids[r, : len(seq)] = torch.tensor(seq)
        att[r, : len(seq)] = 1
        pos[r] = torch.arange(start, start + width)
    att = torch.cat([past, att], dim=1)
    out = decoder(
        input_ids=ids.to(dev),
        attention_mask=att.to(dev),
        position_ids=pos.to(dev),
        past_key_values=cache,
        use_cache=True,
    )
    return out.last_hidden_state, out.past_key_values, att


def _prefix_cache(
    decoder: Any, prefix: list[int], rows: int, dev: torch.device
) -> tuple[Any, torch.Tensor]:
    """``prefix`` forwarded once (batch size 1), its KV cache expanded to ``rows`` rows by
    an index_select (in the autograd graph: the prefix gets every row's gradient)."""
    out = decoder(input_ids=torch.tensor([prefix], device=dev), use_cache=True)
    cache = out.past_key_values
    cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=dev))
    return cache, torch.ones(rows, len(prefix), dtype=torch.long)


def shared_prompt_hidden(decoder: Any, batch: MicroBatch, dev: torch.device, prefix: int = 0):
    """Each distinct prompt is forwarded once (after the shared ``prefix``, itself
    forwarded once); its KV cache (still in the autograd graph, so prompt positions get
    their gradient from every completion) is then repeated for the completions that
    follow it. Returns the hidden states that predict each sampled token, in order."""
    samples = batch.samples
    index: dict[tuple[int, ...], int] = {}
    for s in samples:
        index.setdefault(tuple(s.prompt_ids), len(index))
    prompts = list(index)
    if prefix:
        cache, past = _prefix_cache(decoder, list(prompts[0][:prefix]), len(prompts), dev)
    else:
        cache, past = None, torch.zeros(len(prompts), 0, dtype=torch.long)
    rests = [list(p[prefix:]) for p in prompts]
    p_hidden, cache, past = _extend(decoder, cache, past, rests, [prefix] * len(rests), dev)
    rows = torch.tensor([index[tuple(s.prompt_ids)] for s in samples], device=dev)
    cache.reorder_cache(rows)  # row r: its sample's prompt (index_select, differentiable)
    past = past.index_select(0, rows.cpu())
    c_seqs = [s.completion_ids for s in samples]
    c_hidden, _, _ = _extend(
        decoder, cache, past, c_seqs, [len(s.prompt_ids) for s in samples], dev
    )
    # token 0 is predicted by the prompt's last position, token j by completion j - 1
    p_width, c_width = p_hidden.shape[1], c_hidden.shape[1]
    p_flat = p_hidden.reshape(-1, p_hidden.shape[-1])
    c_flat = c_hidden.reshape(-1, c_hidden.shape[-1])
    pieces = []
    for r, s in enumerate(samples):
        last = int(rows[r]) * p_width + len(s.prompt_ids) - 1 - prefix
        pieces.append(p_flat[last : last + 1])
        pieces.append(c_flat[r * c_width : r * c_width + len(s.completion_ids) - 1])
    return torch.cat(pieces)


def padded_hidden(decoder: Any, batch: MicroBatch, dev: torch.device, prefix: int = 0):
    """One right-padded row per sample (prompt + completion), or per merged chain (its
    last turn's prompt + completion), after the shared ``prefix`` (forwarded once), read
    at the positions that predict each turn's sampled tokens: never at the tokens between
    turns (trainer/merge.py)."""
    seqs = [_seq(row) for row in batch.rows]
    if prefix:
        cache, past = _prefix_cache(decoder, seqs[0][:prefix], len(seqs), dev)
        hidden, _, _ = _extend(
            decoder, cache, past, [q[prefix:] for q in seqs], [prefix] * len(seqs), dev
        )
    else:  # exactly the forward without a shared prefix
        width = max(map(len, seqs))
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        attention = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, : len(q)] = torch.tensor(q)
            attention[i, : len(q)] = 1
        hidden = decoder(
            input_ids=ids.to(dev), attention_mask=attention.to(dev), use_cache=False
        ).last_hidden_state
    width = hidden.shape[1]
    gather: list[int] = []
    for i, row in enumerate(batch.rows):
        for s in row:
            start = i * width + len(s.prompt_ids) - 1 - prefix  # position predicting token 0
            gather.extend(range(start, start + len(s.completion_ids)))
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, torch.tensor(gather, device=dev))
