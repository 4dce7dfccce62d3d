"""How much of the free memory SGLang on CPU may plan with (``--mem-fraction-static``).

On CPU, SGLang reads the memory available when it starts, loads the weights, and then
sizes its KV pool from what the fraction leaves: it fails to start ("Not enough memory")
when ``fraction * available`` does not hold the weights, the KV cache it is asked for
(``--max-total-tokens``) and its own working memory. A fixed fraction is wrong on both
sides: 0.2 of 3 GB free does not hold the packaged model's float32 weights, and 0.2 of 200
GB reserves far more than needed. So the fraction is computed from what this start needs
and what is free now, and the reason is printed beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WORKING_BYTES = 1 << 30  # SGLang's own working memory on CPU, plus growth of others meanwhile
FLOOR, CEILING = 0.05, 0.9
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}
GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    """The fraction to pass, and the figures it came from (all in bytes)."""

    fraction: float
    weights: int
    kv_cache: int
    available: int

    @property
    def need(self) -> int:
        return self.weights + self.kv_cache + WORKING_BYTES

    @property
    def short(self) -> bool:
        """The need is more than the ceiling of what is free: the start may fail."""
        return self.need > CEILING * self.available

    def reason(self) -> str:
        return (
            f"--mem-fraction-static {self.fraction} of {self.available / GB:.1f} GB available: "
            f"weights {self.weights / GB:.2f} GB + KV cache {self.kv_cache / GB:.2f} GB + "
            f"{WORKING_BYTES / GB:.1f} GB working memory"
            + ("; LESS MEMORY IS FREE THAN THAT, the start may fail" if self.short else "")
        )


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what a new process can take without swapping)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def flag_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value of ``flag`` in an argument list (``--flag V`` or ``--flag=V``)."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def plan(model_dir: Path, args: list[str] | tuple[str, ...], available: int) -> MemoryPlan:
    """The fraction for SGLang on CPU with ``args`` (its ``--dtype``, ``--max-total-tokens``
    or else ``--context-length``) on the HF model in ``model_dir``."""
    config = json.loads((model_dir / "config.json").read_text())
    dtype = flag_value(args, "--dtype") or config.get("torch_dtype") or "float32"
    width = _DTYPE_BYTES.get(dtype, 4)
    stored = _DTYPE_BYTES.get(config.get("torch_dtype") or "float32", 4)
    files = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    weights = files * width // stored
    tokens = int(
        flag_value(args, "--max-total-tokens")
        or flag_value(args, "--context-length")
        or config.get("max_position_embeddings", 8192)
    )
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    per_token = (
        2
        * config.get("num_hidden_layers", 0)
        * config.get("num_key_value_heads", heads)
        * head_dim
        * width
    )
    kv = tokens * per_token
    need = weights + kv + WORKING_BYTES
    fraction = min(CEILING, max(FLOOR, -(-need * 100 // max(available, 1)) / 100))
    return MemoryPlan(fraction, weights, kv, available)


def with_fraction(
    model_dir: Path, args: list[str] | tuple[str, ...], available: int | None = None
) -> tuple[list[str], MemoryPlan | None]:
    """``args`` with a computed ``--mem-fraction-static`` when they run SGLang on CPU and
    name none (an operator's own value wins), and the plan it came from."""
    out = list(args)
    if flag_value(out, "--device") != "cpu" or flag_value(out, "--mem-fraction-static"):
        return out, None
    p = plan(model_dir, out, available_bytes() if available is None else available)
    return [*out, "--mem-fraction-static", str(p.fraction)], p
