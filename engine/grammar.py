"""Grammar-constrained sampling: SGLang's ``json_schema``, ``regex``, ``ebnf`` and
``structural_tag`` params (the subset of ``structural_tag`` in engine/structural_tag.py).

Backed by llguidance (the Rust library SGLang also offers as ``--grammar-backend
llguidance``; CPU-only, no model-specific code). One :class:`GrammarCompiler` per engine
turns a request's constraint into a checked grammar once; every sampled sequence then
gets its own :class:`Constraint`, a matcher that says which tokens may come next.

Semantics, as in SGLang: before sampling, the logits of tokens the grammar forbids are
set to ``-inf``; the token is drawn from, and its logprob reported under, that masked
distribution (so a recorded logprob is the probability the sampler actually used). When
the grammar is complete, only end-of-sequence tokens are allowed, and the sequence
finishes on one of them like any other.
"""

from __future__ import annotations

import threading
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch as llg_torch
import torch
from llguidance.gbnf_to_lark import any_to_lark

from engine.structural_tag import StructuralTagError, to_grammar

MAX_GRAMMAR_CHARS = 400_000  # a constraint text larger than this is refused (a structural
# tag holds the schemas of every tool offered)


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message says what is wrong."""


class Constraint:
    """The grammar state of one sampled sequence."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.bitmask = llg_torch.allocate_token_bitmask(1, vocab_size)

    def mask_(self, logits_row: torch.Tensor) -> None:
        """Set the logits of forbidden tokens to -inf, in place (``logits_row``: ``(V,)``)."""
        llg_torch.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        llg_torch.apply_token_bitmask_inplace(logits_row[None, :], self.bitmask)

    def accept(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""


class GrammarCompiler:
    """Compiles constraints for one tokenizer (the llguidance tokenizer is built lazily:
    it takes about half a second, and most engines never see a constraint)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int) -> None:
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        self._lltok: Any = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._lltok is None:
                self._lltok = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size)
            return self._lltok

    def grammar(self, kind: str, source: str) -> str:
        """A checked llguidance grammar for ``kind`` in json_schema | regex | ebnf |
        structural_tag."""
        if not isinstance(source, str) or not source:
            raise GrammarError(f"{kind} must be a non-empty string")
        if len(source) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"{kind} is {len(source)} characters; at most {MAX_GRAMMAR_CHARS}")
        try:
            if kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(source)
            elif kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(source)
            elif kind == "ebnf":
                grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(source))
            elif kind == "structural_tag":
                grammar = to_grammar(source)
            else:
                raise GrammarError(f"unknown constraint kind {kind!r}")
        except StructuralTagError as e:
            raise GrammarError(str(e)) from None
        except (ValueError, TypeError, RuntimeError) as e:
            raise GrammarError(f"{kind} cannot be compiled: {e}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer())
        if error:
            raise GrammarError(f"{kind} cannot be compiled: {error}")
        return grammar  # type: ignore[no-any-return]

    def constraint(self, grammar: str) -> Constraint:
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar)
        if matcher.is_error():
            raise GrammarError(f"the grammar cannot start: {matcher.get_error()}")
        return Constraint(matcher, self.vocab_size)
