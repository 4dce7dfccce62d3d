"""LoRA adapters: loading PEFT directories, the registry, and batched application.

For each target projection ``y = W x + scaling * B (A x)``; within one batch each row
uses its own adapter (or none). Rows are grouped by adapter, so a batch with one adapter
costs two thin matmuls per projection and rows without an adapter cost nothing extra.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.projections import PROJECTIONS

DEFAULT_TARGET_MODULES = PROJECTIONS
log = logging.getLogger("rlgate.engine")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class AdapterError(Exception):
    """An adapter cannot be loaded, unloaded or used; the message says why."""


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    target_modules: frozenset[str]
    # (layer, projection) -> (A (r, in), B (out, r))
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    pinned: bool = False
    refcount: int = 0
    unloading: bool = False


@dataclass
class LoraBatch:
    """Which rows of a flattened batch use which adapter (rows ``None`` = all rows)."""

    groups: list[tuple[LoraAdapter, torch.Tensor | None]] = field(default_factory=list)

    @classmethod
    def for_rows(cls, adapters: list[LoraAdapter | None]) -> LoraBatch | None:
        by_adapter: dict[int, tuple[LoraAdapter, list[int]]] = {}
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                by_adapter.setdefault(id(adapter), (adapter, []))[1].append(row)
        if not by_adapter:
            return None
        groups: list[tuple[LoraAdapter, torch.Tensor | None]] = []
        for adapter, rows in by_adapter.values():
            index = None if len(rows) == len(adapters) else torch.tensor(rows, dtype=torch.long)
            groups.append((adapter, index))
        return cls(groups)

    def apply(self, x: torch.Tensor, y: torch.Tensor, layer: int, name: str) -> torch.Tensor:
        for adapter, rows in self.groups:
            pair = adapter.weights.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            if rows is None:
                y = y + F.linear(F.linear(x, a), b) * adapter.scaling
            else:
                delta = F.linear(F.linear(x.index_select(0, rows), a), b) * adapter.scaling
                y = y.index_add(0, rows, delta)
        return y


def read_peft_adapter(
    name: str,
    path: str,
    *,
    num_layers: int,
    module_shape: dict[str, tuple[int, int]],
    max_rank: int,
    allowed_modules: frozenset[str],
    dtype: torch.dtype,
) -> LoraAdapter:
    """Load and check a PEFT LoRA directory (adapter_config.json + weights)."""
    root = Path(path)
    config_file = root / "adapter_config.json"
    if not config_file.is_file():
        raise AdapterError(f"{path}: no adapter_config.json (expected a PEFT LoRA directory)")
    config = json.loads(config_file.read_text())
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    for flag in ("use_dora",):
        if config.get(flag):
            raise AdapterError(f"{path}: {flag} adapters are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: LoRA bias={config.get('bias')!r} is not supported")
    if config.get("modules_to_save"):
        raise AdapterError(f"{path}: modules_to_save is not supported")
    if config.get("alpha_pattern") or config.get("rank_pattern"):
        raise AdapterError(f"{path}: rank_pattern/alpha_pattern are not supported")
    rank = int(config.get("r", 8))
    if rank > max_rank:
        raise AdapterError(
            f"adapter rank {rank} exceeds --max-lora-rank {max_rank}; "
            "restart the engine with a larger --max-lora-rank or train a smaller rank"
        )
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank

    tensors = _read_weights(root)
    weights: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise AdapterError(f"{path}: unsupported adapter weight {key!r}")
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        weights.setdefault((layer, module), {})[which] = tensor
    modules = frozenset(module for _, module in weights)
    extra = modules - allowed_modules
    if extra:
        raise AdapterError(
            f"adapter targets {sorted(extra)}, not in --lora-target-modules "
            f"{sorted(allowed_modules)}"
        )
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), pair in weights.items():
        if set(pair) != {"A", "B"} or not 0 <= layer < num_layers:
            raise AdapterError(f"{path}: incomplete or out-of-range weights for {layer}.{module}")
        a, b = pair["A"], pair["B"]
        out_f, in_f = module_shape[module]
        if a.shape[1] != in_f or b.shape[0] != out_f or a.shape[0] != b.shape[1]:
            raise AdapterError(
                f"{path}: {module} shapes A{tuple(a.shape)} B{tuple(b.shape)} do not fit "
                f"this model ({out_f}x{in_f})"
            )
        if a.shape[0] > max_rank:
            raise AdapterError(f"adapter rank {a.shape[0]} exceeds --max-lora-rank {max_rank}")
        out[(layer, module)] = (a.to(dtype).contiguous(), b.to(dtype).contiguous())
    if not out:
        raise AdapterError(f"{path}: the adapter holds no LoRA weights")
    return LoraAdapter(
        name=name, path=str(path), rank=rank, scaling=scaling, target_modules=modules, weights=out
    )


def check_adapter_dir(path: str, allowed: Path | None) -> None:
    """Refuse an adapter path outside ``allowed`` (``--allowed-lora-dir``), after resolving
    symlinks and ``..``; ``allowed`` None accepts any path the engine can read."""
    if allowed is None:
        return
    root = allowed.resolve()
    if not Path(path).resolve().is_relative_to(root):
        raise AdapterError(
            f"{path} is outside the engine's adapter directory {root} (--allowed-lora-dir); "
            "publish adapters under it"
        )


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    st = root / "adapter_model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    binary = root / "adapter_model.bin"
    if binary.is_file():
        return torch.load(str(binary), map_location="cpu", weights_only=True)
    raise AdapterError(f"{root}: no adapter_model.safetensors or adapter_model.bin")


class AdapterRegistry:
    """Loaded adapters by name, with per-adapter use counts.

    ``acquire``/``release`` bracket every request that uses an adapter. ``unload`` marks
    the adapter so that new requests are refused, then waits until running requests
    that hold it have finished, then drops it.
    """

    def __init__(self, max_loaded: int) -> None:
        self.max_loaded = max_loaded
        self._adapters: dict[str, LoraAdapter] = {}
        self._cond = threading.Condition()

    def names(self) -> dict[str, str]:
        with self._cond:
            return {a.name: a.path for a in self._adapters.values() if not a.unloading}

    def use_counts(self) -> dict[str, int]:
        """Requests currently holding each loaded adapter (0 when idle)."""
        with self._cond:
            return {a.name: a.refcount for a in self._adapters.values()}

    def reserve_check(self, name: str) -> None:
        """Fail early (before reading files) if ``name`` could not be added."""
        with self._cond:
            self._check_room(name)

    def add(self, adapter: LoraAdapter) -> None:
        with self._cond:
            self._check_room(adapter.name)
            self._adapters[adapter.name] = adapter

    def _check_room(self, name: str) -> None:
        if name in self._adapters:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        if len(self._adapters) >= self.max_loaded:
            raise AdapterError(
                f"{len(self._adapters)} adapters are loaded, the limit "
                f"(--max-loaded-loras) is {self.max_loaded}; unload one first"
            )

    def acquire(self, name: str) -> LoraAdapter:
        with self._cond:
            adapter = self._adapters.get(name)
            if adapter is None or adapter.unloading:
                loaded = sorted(n for n, a in self._adapters.items() if not a.unloading)
                raise AdapterError(f"unknown LoRA adapter {name!r}; loaded adapters: {loaded}")
            adapter.refcount += 1
            return adapter

    def release(self, adapter: LoraAdapter) -> None:
        with self._cond:
            if adapter.refcount <= 0:  # a double release must not let unload drop it in use
                log.error("adapter %r released more often than acquired", adapter.name)
                return
            adapter.refcount -= 1
            self._cond.notify_all()

    def unload(self, name: str, timeout: float | None = None) -> None:
        """Refuse new uses of ``name``, wait for running ones, then drop it."""
        with self._cond:
            adapter = self._adapters.get(name)
            if adapter is None or adapter.unloading:  # SGLang's wording
                loaded = sorted(n for n, a in self._adapters.items() if not a.unloading)
                raise AdapterError(f"LoRA with name {name} does not exist. Loaded LoRAs: {loaded}")
            adapter.unloading = True
            done = self._cond.wait_for(lambda: adapter.refcount == 0, timeout=timeout)
            if not done:
                adapter.unloading = False
                raise AdapterError(
                    f"adapter {name!r} is still used by running requests after {timeout} s"
                )
            del self._adapters[name]
            self._cond.notify_all()

    def wait_unloaded(self, name: str, timeout: float | None = None) -> bool:
        """Wait while an unload of ``name`` is pending; True when none is (any more)."""
        with self._cond:

            def settled() -> bool:
                adapter = self._adapters.get(name)
                return adapter is None or not adapter.unloading

            return self._cond.wait_for(settled, timeout=timeout)
