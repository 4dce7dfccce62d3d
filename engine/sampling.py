"""Per-request sampling params and the batched sampler.

Logprob semantics follow SGLang's sampler (default settings):

* temperature 0 (greedy): the token is ``argmax(logits)`` and its logprob is
  ``log_softmax(logits)``;
* temperature T > 0: the logprob is ``log_softmax(logits / T)``, computed before top-k,
  top-p and min-p filtering; the token is drawn from the filtered, renormalised
  distribution;
* with the env var ``SGLANG_RETURN_ORIGINAL_LOGPROB`` true, the logprob is always
  ``log_softmax(logits)`` (unscaled), as in SGLang.

Frequency and presence penalties are applied to the logits first, as SGLang's penalizers
do (before the grammar mask and the temperature): ``logit[t] -= frequency_penalty *
count(t) + presence_penalty * (count(t) > 0)``, counting the tokens this sequence has
generated so far (not the prompt). The reported logprobs are of the penalized
distribution, as in SGLang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from engine.grammar import Constraint


def return_original_logprob() -> bool:
    return os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "false").lower() in ("1", "true")


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    grammar: str | None = None  # a compiled llguidance grammar (engine/grammar.py), or None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6

    @property
    def penalized(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


@dataclass
class SampledToken:
    token_id: int
    logprob: float
    top: list[tuple[float, int]] | None  # (logprob, id), best first


def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    top_logprobs_num: list[int],
    constraints: list[Constraint | None] | None = None,
    generated: list[list[int]] | None = None,
) -> list[SampledToken]:
    """Sample one token per row of ``logits`` ``(B, V)`` (float32). A row with penalties
    is penalized by its ``generated`` ids so far, then a row with a grammar ``constraint``
    is masked (its logprobs are those of the penalized, masked distribution, as in
    SGLang), and the drawn token is fed to the constraint."""
    penalties = penalty_logits(logits, params, generated)
    if penalties is not None:  # out of place: the model's logits are inference tensors
        logits = logits - penalties
    for row, c in enumerate(constraints or ()):
        if c is not None:
            c.mask_(logits[row])
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], dtype=logits.dtype)[
        :, None
    ]
    scaled = logits / temps
    logprobs = torch.log_softmax(scaled, dim=-1)
    reported = torch.log_softmax(logits, dim=-1) if return_original_logprob() else logprobs
    greedy_ids = logits.argmax(dim=-1)
    out: list[SampledToken] = []
    for row, p in enumerate(params):
        draw = not p.greedy
        token = _draw(logprobs[row].exp(), p, generators[row]) if draw else int(greedy_ids[row])
        top = None
        if top_logprobs_num[row] > 0:
            values, ids = torch.topk(reported[row], top_logprobs_num[row])
            top = [(float(v), int(i)) for v, i in zip(values, ids, strict=True)]
        out.append(SampledToken(token, float(reported[row, token]), top))
    for c, tok in zip(constraints or (), out, strict=False):
        if c is not None:
            c.accept(tok.token_id)
    return out


def penalty_logits(
    logits: torch.Tensor, params: list[SamplingParams], generated: list[list[int]] | None
) -> torch.Tensor | None:
    """What OpenAI's frequency and presence penalties subtract from each row of
    ``logits``: ``f * count + p * (count > 0)`` over the ids generated so far; None when
    no row is penalized."""
    rows = [r for r, p in enumerate(params) if p.penalized and generated and generated[r]]
    if not rows or generated is None:
        return None
    out = torch.zeros(logits.shape, dtype=logits.dtype)
    for r in rows:
        p, ids = params[r], torch.tensor(generated[r], dtype=torch.long)
        counts = torch.zeros(logits.shape[1], dtype=logits.dtype)
        counts.index_add_(0, ids, torch.ones(len(ids), dtype=logits.dtype))
        out[r] = p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return out


def _draw(probs: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
    """Draw from ``probs`` after top-k, top-p and min-p filtering (SGLang's order)."""
    if p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0.0:
        return int(torch.multinomial(probs, 1, generator=generator))
    if 0 < p.top_k < probs.shape[0]:
        sorted_probs, sorted_ids = torch.topk(probs, p.top_k)
    else:
        sorted_probs, sorted_ids = torch.sort(probs, descending=True)
    if p.top_p < 1.0:
        cumulative = torch.cumsum(sorted_probs, dim=0)
        sorted_probs = torch.where(cumulative - sorted_probs > p.top_p, 0.0, sorted_probs)
    if p.min_p > 0.0:
        sorted_probs = torch.where(sorted_probs < sorted_probs[0] * p.min_p, 0.0, sorted_probs)
    choice = int(torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator))
    return int(sorted_ids[choice])
