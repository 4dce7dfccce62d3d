"""The scheduler: one thread that owns the model and runs continuous batching.

Loop: take new requests and aborts from the inbox; admit waiting requests into free
KV slots (prefill each, sample its first token); run one batched decode step for every
running sequence; retire finished ones. Requests therefore join and leave between
decode steps, each with its own sampling params and adapter.

Running sequence ``i`` always sits in KV slot ``i``: when one finishes, the last one is
moved into its slot, so decode attention reads contiguous slices of the cache.

Results go back through each request's ``sink`` callback (called on the scheduler
thread; the HTTP layer forwards it into its event loop). Any error inside a step aborts
the affected requests with a message; the loop itself keeps running.

Only this thread runs torch on several threads (``--num-threads``); every other thread of
the engine runs its torch work on one (``one_torch_thread``). PyTorch parallelizes with
OpenMP (libgomp), which gives each thread that runs a parallel region its own pool of
workers; once the pools hold more threads than there are cores, every worker sleeps
instead of spinning between regions, and a decode step's hundreds of small parallel ops
each pay a wake-up. Measured with ``--weights int4`` at one stream on 2 cores: 14 ms a
step from the thread that owns the only pool, 32 ms once the thread that loaded the
model had a pool too.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.grammar import Constraint
from engine.llama import KVCache, LlamaModel
from engine.lora import AdapterRegistry, LoraAdapter, LoraBatch
from engine.prefix_cache import Donor, PrefixCache, longest_prefix
from engine.sampling import SampledToken, SamplingParams, sample_batch

log = logging.getLogger("rlgate.engine")

Sink = Callable[[dict[str, Any], bool], None]


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch work in this block runs on one thread (see the module docstring): for the
    threads that load the model and adapters, not the scheduler's."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(eq=False)
class Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    sink: Sink
    adapter: LoraAdapter | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1  # >= 0: the prompt's logprobs from this position on
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    created: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    slot: int = -1
    cached_tokens: int = 0  # prompt positions copied from another slot, not recomputed
    generator: torch.Generator = field(default_factory=torch.Generator)
    constraint: Constraint | None = None  # grammar state (structured output), per sequence
    # the prompt's logprobs from logprob_start_len on, as SGLang returns them: the first
    # position None, each later one the logprob (and top alternatives) of that prompt token
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top: list[list[tuple[float, int]] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Seeded here, while the request is built (before it holds an adapter), so a seed
        # torch cannot take fails the request instead of leaking an adapter use.
        if self.params.seed is not None:
            self.generator.manual_seed(self.params.seed)
        else:
            self.generator.seed()


class Scheduler:
    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Any,
        eos_token_ids: set[int],
        registry: AdapterRegistry,
        *,
        max_running: int,
        context_length: int,
        weight_version: str = "default",
        num_threads: int | None = None,
        prefix_reuse: bool = True,
        prefix_cache_slots: int = 4,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.registry = registry
        self.max_running = max_running
        self.context_length = context_length
        self.weight_version = weight_version
        self.num_threads = num_threads or os.cpu_count() or 1
        # slots 0..max_running-1 hold running sequences; the rest keep finished ones
        spare = prefix_cache_slots if prefix_reuse else 0
        self.cache = KVCache(model.cfg, max_running + spare, context_length, model.dtype)
        self.prefix = PrefixCache(self.cache, max_running, spare) if prefix_reuse else None
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._thread = threading.Thread(target=self._loop, name="rlgate-scheduler", daemon=True)
        self._stopped = threading.Event()
        self.steps = 0

    # ---- API for other threads ----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(("stop", None))
        self._thread.join(timeout=10)

    def submit(self, req: Request) -> None:
        """Queue ``req``; from here on the scheduler releases its adapter when it ends."""
        self._inbox.put(("submit", req))

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def abort_all(self) -> None:
        self._inbox.put(("abort_all", None))

    @property
    def load(self) -> dict[str, int]:
        return {"running": len(self._running), "waiting": len(self._waiting)}

    # ---- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        torch.set_num_threads(self.num_threads)
        while not self._stopped.is_set():
            try:
                self._drain_inbox(block=not (self._running or self._waiting))
                self._admit()
                if self._running:
                    self._decode_step()
            except Exception:  # pragma: no cover - last line of defence
                log.error("scheduler step failed:\n%s", traceback.format_exc())
                for req in list(self._running):
                    self._finish(req, _abort("internal engine error"))
        for req in list(self._running) + list(self._waiting):
            self._finish(req, _abort("engine shutting down"))

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                kind, value = self._inbox.get(block=block, timeout=None)
            except queue.Empty:
                return
            block = False
            if kind == "submit":
                self._waiting.append(value)
            elif kind == "abort":
                for req in [r for r in self._waiting if r.rid == value]:
                    self._finish(req, _abort("aborted by request"))
                for req in [r for r in self._running if r.rid == value]:
                    self._finish(req, _abort("aborted by request"))
            elif kind == "abort_all":
                for req in list(self._waiting) + list(self._running):
                    self._finish(req, _abort("aborted by request"))
            elif kind == "stop":
                self._stopped.set()
                return

    def _admit(self) -> None:
        """Admit waiting requests into free slots and prefill them together in one pass.

        A request whose prompt shares a longer prefix with another request of this same
        batch than with any running sequence waits one step: once that one is prefilled
        it copies the prefix instead of computing it again (the ``n`` samples of a request
        are prefilled once)."""
        batch: list[tuple[Request, int, Donor | None]] = []
        later: list[Request] = []
        while self._waiting and len(self._running) + len(batch) < self.max_running:
            req = self._waiting.popleft()
            if req.params.max_new_tokens == 0 and req.logprob_start_len < 0:
                self._finish(req, {"type": "length", "length": 0, "matched": None})
                continue  # nothing to compute (with the prompt's logprobs: prefilled)
            try:
                shared, donor = (
                    self.prefix.best_donor(req, self._running) if self.prefix else (0, None)
                )
                if req.logprob_start_len >= 0:  # the prompt's logprobs: compute it all
                    shared, donor = 0, None
                elif self.prefix and batch:
                    in_batch, _ = longest_prefix(req, [r for r, _, _ in batch])
                    if in_batch > shared:
                        later.append(req)
                        continue
            except Exception:  # the request is in no queue now: end it, releasing its adapter
                log.error("admitting %s failed:\n%s", req.rid, traceback.format_exc())
                self._finish(req, _abort("internal engine error during admission"))
                continue
            batch.append((req, shared, donor))
        self._waiting.extendleft(reversed(later))
        if not batch:
            return
        items = []
        for req, shared, donor in batch:
            req.slot = len(self._running)
            self._running.append(req)
            if self.prefix and donor is not None:
                self.prefix.copy(req, shared, donor)
            items.append((req.input_ids, req.slot, req.cached_tokens))
        reqs = [r for r, _, _ in batch]
        try:
            rows = [r.adapter for r in reqs for _ in r.input_ids[r.cached_tokens :]]
            full = [r.logprob_start_len >= 0 for r in reqs]
            logits, every = self.model.prefill_batch_full(
                items, self.cache, LoraBatch.for_rows(rows), full
            )
            for req, prompt_logits in zip(reqs, every, strict=True):
                if prompt_logits is not None:
                    _input_logprobs(req, prompt_logits)
            sampled = sample_batch(
                logits,
                [r.params for r in reqs],
                [r.generator for r in reqs],
                [r.top_logprobs_num for r in reqs],
                [r.constraint for r in reqs],
                [r.output_ids for r in reqs],
            )
        except Exception:
            log.error("prefill of %d request(s) failed:\n%s", len(reqs), traceback.format_exc())
            for req in reqs:
                self._finish(req, _abort("internal engine error during prefill"))
            return
        for req, tok in zip(reqs, sampled, strict=True):
            if req.params.max_new_tokens == 0:  # only the prompt's logprobs were asked for
                self._finish(req, {"type": "length", "length": 0, "matched": None})
            else:
                self._accept(req, tok)

    def _decode_step(self) -> None:
        running = self._running
        tokens = torch.tensor([r.output_ids[-1] for r in running], dtype=torch.long)
        positions = torch.tensor(
            [len(r.input_ids) + len(r.output_ids) - 1 for r in running], dtype=torch.long
        )
        lora = LoraBatch.for_rows([r.adapter for r in running])
        logits = self.model.decode(tokens, positions, self.cache, lora)
        sampled = sample_batch(
            logits,
            [r.params for r in running],
            [r.generator for r in running],
            [r.top_logprobs_num for r in running],
            [r.constraint for r in running],
            [r.output_ids for r in running],
        )
        self.steps += 1
        for req, tok in zip(list(running), sampled, strict=True):
            self._accept(req, tok)

    # ---- per-request bookkeeping --------------------------------------------------------

    def _accept(self, req: Request, tok: SampledToken) -> None:
        req.output_ids.append(tok.token_id)
        req.logprobs.append(tok.logprob)
        if tok.top is not None:
            req.top_logprobs.append(tok.top)
        reason = self._check_finished(req)
        if reason is not None:
            self._finish(req, reason)
        elif req.stream:
            self._emit(req, final=False)

    def _check_finished(self, req: Request) -> dict[str, Any] | None:
        p = req.params
        if len(req.output_ids) >= p.max_new_tokens:
            return {"type": "length", "length": p.max_new_tokens, "matched": None}
        last = req.output_ids[-1]
        if not p.ignore_eos and (last in p.stop_token_ids or last in self.eos_token_ids):
            return {"type": "stop", "matched": last}
        if p.stop:
            window = max(len(s) for s in p.stop) + 2
            tail = self.tokenizer.decode(
                req.output_ids[-window:], skip_special_tokens=p.skip_special_tokens
            )
            for s in p.stop:
                if s in tail:
                    return {"type": "stop", "matched": s}
        return None

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        """End ``req``: free its slot, release its adapter use, send its final output.
        The adapter is released and the output sent even if freeing the slot fails."""
        req.finish_reason = reason
        try:
            if req in self._waiting:
                self._waiting.remove(req)
            if self.prefix and reason["type"] in ("stop", "length") and req.slot >= 0:
                self.prefix.retire(req)
            if req.slot >= 0 and req in self._running:
                i = req.slot
                last = self._running.pop()
                if last is not req:
                    self.cache.move(last.slot, i, len(last.input_ids) + len(last.output_ids))
                    last.slot = i
                    self._running[i] = last
        finally:
            req.slot = -1
            if req.adapter is not None:
                self.registry.release(req.adapter)
                req.adapter = None
            self._emit(req, final=True)

    def _emit(self, req: Request, final: bool) -> None:
        try:
            req.sink(self.response(req, final), final)
        except Exception:
            log.warning("could not deliver output of %s:\n%s", req.rid, traceback.format_exc())

    def response(self, req: Request, final: bool) -> dict[str, Any]:
        """The SGLang-shaped ``/generate`` response for the current state of ``req``."""
        p = req.params
        reason = req.finish_reason
        ids_for_text = req.output_ids
        if final and reason and isinstance(reason.get("matched"), int) and not p.no_stop_trim:
            ids_for_text = req.output_ids[:-1]
        text = self.tokenizer.decode(ids_for_text, skip_special_tokens=p.skip_special_tokens)
        if final and reason and isinstance(reason.get("matched"), str) and not p.no_stop_trim:
            cut = text.find(reason["matched"])
            if cut >= 0:
                text = text[:cut]
        if not final:
            text = text.rstrip("\ufffd")  # hold back an incomplete multi-byte character
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": reason if final else None,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "weight_version": self.weight_version,
            "e2e_latency": time.monotonic() - req.created,
        }
        if req.return_logprob:
            start = max(req.logprob_start_len, 0)
            meta["input_token_logprobs"] = [
                [lp, tid, self._token_text(tid, req)]
                for lp, tid in zip(req.input_logprobs, req.input_ids[start:], strict=False)
            ]
            meta["output_token_logprobs"] = [
                [lp, tid, self._token_text(tid, req)]
                for lp, tid in zip(req.logprobs, req.output_ids, strict=True)
            ]
            if req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [
                    None if pos is None else [[lp, t, self._token_text(t, req)] for lp, t in pos]
                    for pos in req.input_top
                ]
                meta["output_top_logprobs"] = [
                    [[lp, tid, self._token_text(tid, req)] for lp, tid in pos]
                    for pos in req.top_logprobs
                ]
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    def _token_text(self, token_id: int, req: Request) -> str | None:
        if not req.return_text_in_logprobs:
            return None
        return self.tokenizer.decode([token_id])


def _input_logprobs(req: Request, logits: torch.Tensor) -> None:
    """The prompt's logprobs from ``logprob_start_len`` on (``logits``: every prompt
    position's, from 0): as SGLang, the first position is None and position j > start
    is the logprob of prompt token j given the tokens before it, unscaled by the
    temperature; with ``top_logprobs_num`` also the top alternatives at each position."""
    ids = req.input_ids
    start = min(req.logprob_start_len, len(ids) - 1)
    lp = torch.log_softmax(logits[start : len(ids) - 1].float(), dim=-1)
    nxt = torch.tensor(ids[start + 1 :], dtype=torch.long)
    req.input_logprobs = [None, *lp.gather(1, nxt[:, None])[:, 0].tolist()]
    if req.top_logprobs_num > 0:
        values, top_ids = torch.topk(lp, min(req.top_logprobs_num, lp.shape[-1]), dim=-1)
        req.input_top = [None] + [
            list(zip(v, i, strict=True))
            for v, i in zip(values.tolist(), top_ids.tolist(), strict=True)
        ]


def _abort(message: str) -> dict[str, Any]:
    return {"type": "abort", "message": message, "matched": None}
