"""The ``Engine`` object: model, tokenizer, grammars, adapters and the scheduler thread.

``engine/server.py`` puts HTTP in front of it; here nothing knows about HTTP. The model
belongs to the scheduler thread (``engine.scheduler``); ``build_requests`` validates a
``/generate`` body's items and turns them into scheduler requests.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from engine import memory
from engine import scheduler as sched
from engine.grammar import GrammarCompiler, GrammarError
from engine.llama import LlamaConfig, LlamaModel
from engine.lora import (
    DEFAULT_TARGET_MODULES,
    AdapterError,
    AdapterRegistry,
    check_adapter_dir,
    read_peft_adapter,
)
from engine.model_files import resolve_model_dir
from engine.protocol import GenerateItem, ProtocolError

DEFAULT_CONTEXT_LENGTH = 4096


@dataclass
class EngineConfig:
    model_path: str
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "float32"
    weights: str = "int4"  # --weights: 4-bit projections kept packed (engine/int4.py), or "float"
    max_lora_rank: int = 64
    lora_target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    max_loaded_loras: int = 8
    max_running_requests: int = 16
    context_length: int | None = None
    served_model_name: str | None = None
    log_level: str = "info"
    num_threads: int | None = None
    lora_paths: dict[str, str] = field(default_factory=dict)
    prefix_reuse: bool = True
    prefix_cache_slots: int = 4
    api_key: str | None = None  # --api-key: required as "Authorization: Bearer <key>"
    allowed_lora_dir: Path | None = None  # --allowed-lora-dir: adapters only from under it
    max_memory_gb: float | None = (
        None  # --max-memory-gb: the worst case must fit (engine/memory.py)
    )


class Engine:
    """Model, tokenizer, adapters and the scheduler thread, ready to serve."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        with sched.one_torch_thread():
            self._load(config)
        self.created = int(time.time())

    def _load(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        self.model_dir = resolve_model_dir(config.model_path, Path(config.data_dir))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
        model_cfg = LlamaConfig.from_dir(self.model_dir)
        self.context_length = config.context_length or min(
            model_cfg.max_position_embeddings, DEFAULT_CONTEXT_LENGTH
        )
        self.allowed_modules = frozenset(config.lora_target_modules)
        spare = config.prefix_cache_slots if config.prefix_reuse else 0
        self.memory = memory.plan(
            model_cfg,
            dtype,
            slots=config.max_running_requests + spare,
            context=self.context_length,
            max_rank=config.max_lora_rank,
            max_adapters=config.max_loaded_loras,
            modules=self.allowed_modules,
        )
        self.memory.check(config.max_memory_gb, spare)  # before anything is allocated
        self.model = LlamaModel(self.model_dir, dtype=dtype, int4=config.weights == "int4")
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.grammars = GrammarCompiler(self.tokenizer, self.model.cfg.vocab_size)
        eos: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        with contextlib.suppress(OSError):
            gen = GenerationConfig.from_pretrained(str(self.model_dir))
            ids = gen.eos_token_id
            eos.update([ids] if isinstance(ids, int) else list(ids or []))
        self.eos_token_ids = eos
        self.served_model_name = config.served_model_name or config.model_path
        self.registry = AdapterRegistry(config.max_loaded_loras)
        # every adapter ever loaded: name -> (path, pinned), as SGLang's lora_ref_cache,
        # to re-load it on demand when a request names it after its unload
        self.known: dict[str, tuple[str, bool]] = {}
        self.scheduler = sched.Scheduler(
            self.model,
            self.tokenizer,
            self.eos_token_ids,
            self.registry,
            max_running=config.max_running_requests,
            context_length=self.context_length,
            num_threads=config.num_threads,
            prefix_reuse=config.prefix_reuse,
            prefix_cache_slots=config.prefix_cache_slots,
        )
        for name, path in config.lora_paths.items():
            self.load_adapter(name, path, pinned=True)

    def weights_summary(self) -> str:
        """What ``--weights`` gave: with int4, how many projections were on the grid."""
        if self.config.weights != "int4":
            return f"{self.config.dtype} weights"
        total = len(self.model.layers) * len(DEFAULT_TARGET_MODULES)
        head = "two passes" if self.model.head is not None else "float"
        return (
            f"int4 weights: {self.model.int4_projections} of {total} projections packed, "
            f"LM head in {head}"
        )

    def load_adapter(self, name: str, path: str, pinned: bool) -> None:
        with sched.one_torch_thread():
            self._load_adapter(name, path, pinned)

    def _load_adapter(self, name: str, path: str, pinned: bool) -> None:
        check_adapter_dir(path, self.config.allowed_lora_dir)
        self.registry.reserve_check(name)
        cfg = self.model.cfg
        adapter = read_peft_adapter(
            name,
            path,
            num_layers=cfg.num_layers,
            module_shape={m: cfg.module_shape(m) for m in DEFAULT_TARGET_MODULES},
            max_rank=self.config.max_lora_rank,
            allowed_modules=self.allowed_modules,
            dtype=self.model.dtype,
        )
        adapter.pinned = pinned
        self.registry.add(adapter)
        self.known[name] = (path, pinned)

    def reload_unloaded(self, names: set[str], timeout: float) -> None:
        """SGLang's behaviour for a request naming adapters that are not loaded: one that
        was loaded before (and unloaded since) is loaded again from the path it was
        loaded from, after an unload still pending for it finished; one never loaded,
        or one whose re-load fails (its path is gone), is an AdapterError (400)."""
        for name in sorted(names):
            if name in self.registry.names():
                continue
            if name not in self.known:
                raise AdapterError(
                    f"unknown LoRA adapter {name!r}: it has never been loaded; "
                    f"loaded adapters: {sorted(self.registry.names())}"
                )
            self.registry.wait_unloaded(name, timeout)
            path, pinned = self.known[name]
            try:
                self.load_adapter(name, path, pinned)
            except AdapterError as e:
                if "already loaded" not in str(e):
                    raise AdapterError(f"Failed to implicitly load LoRA adapter {name}: {e}") from e
            except Exception as e:  # unreadable or missing files
                raise AdapterError(f"Failed to implicitly load LoRA adapter {name}: {e}") from e

    # ---- request building ---------------------------------------------------------------

    def build_requests(
        self, items: list[GenerateItem], stream: bool, text_in_logprobs: bool
    ) -> list[sched.Request]:
        """Validate every item, then build the requests and acquire their adapters; raises
        ProtocolError/AdapterError. On any error, adapters acquired so far are released."""
        vocab = self.model.cfg.vocab_size
        specs: list[tuple[GenerateItem, list[int], Any]] = []
        for item in items:
            if item.input_ids is not None:
                ids = item.input_ids
            else:
                ids = list(self.tokenizer(item.text or "")["input_ids"])
            if not ids:
                raise ProtocolError("the prompt is empty: send at least one input token")
            if min(ids) < 0 or max(ids) >= vocab:
                raise ProtocolError(f"input_ids must be token ids in [0, {vocab})")
            params = item.params.to_params()
            if len(ids) + params.max_new_tokens > self.context_length:
                raise ProtocolError(
                    f"the prompt ({len(ids)} tokens) plus max_new_tokens "
                    f"({params.max_new_tokens}) exceeds the context length "
                    f"({self.context_length} tokens); shorten the prompt or lower max_new_tokens"
                )
            if item.top_logprobs_num > vocab:
                raise ProtocolError(f"top_logprobs_num must be <= {vocab}")
            constraint = item.params.constraint()
            if constraint is not None:
                try:
                    params = replace(params, grammar=self.grammars.grammar(*constraint))
                except GrammarError as e:
                    raise ProtocolError(str(e)) from None
            specs.append((item, ids, params))
        requests: list[sched.Request] = []
        try:
            for item, ids, params in specs:
                base_rid = item.rid or uuid.uuid4().hex
                for j in range(item.params.n):
                    rid = f"{base_rid}-{j}" if item.params.n > 1 else base_rid
                    req = sched.Request(
                        rid=rid,
                        input_ids=list(ids),
                        params=params,
                        sink=_no_sink,
                        return_logprob=item.return_logprob,
                        logprob_start_len=item.logprob_start_len if item.return_logprob else -1,
                        top_logprobs_num=item.top_logprobs_num if item.return_logprob else 0,
                        return_text_in_logprobs=text_in_logprobs,
                        stream=stream,
                    )
                    if params.grammar is not None:
                        req.constraint = self.grammars.constraint(params.grammar)
                    requests.append(req)  # before acquiring, so an error releases it
                    if item.lora_name:
                        req.adapter = self.registry.acquire(item.lora_name)
        except BaseException:
            self.release(requests)
            raise
        return requests

    def release(self, requests: list[sched.Request]) -> None:
        """Release the adapters of requests that never reached the scheduler."""
        for req in requests:
            if req.adapter is not None:
                self.registry.release(req.adapter)
                req.adapter = None


def _no_sink(payload: dict[str, Any], final: bool) -> None:  # replaced before submit
    raise RuntimeError("request submitted without a sink")
