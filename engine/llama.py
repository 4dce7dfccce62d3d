"""A compact Llama-family forward pass for serving, with a per-slot KV cache.

Matches ``transformers``' ``LlamaForCausalLM`` (RMSNorm, rotate-half RoPE with the
config's ``rope_theta``, grouped-query attention, SiLU-gated MLP, optionally tied
embeddings) and adds two things HF does not have in this form:

* a preallocated KV cache with one slot per running sequence; decode steps write one
  position per sequence and attend over each slot's own length (length-masked), so the
  prefix is never recomputed;
* batched multi-LoRA: rows of one batch may use different adapters (see ``engine.lora``).

Running sequences occupy slots ``0..B-1`` (the scheduler keeps them compact), so a
decode step reads the cache through plain slices, never a gather.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from engine.int4 import ROW_BLOCK, Int4Weight, TwoPassHead, pack
from engine.lora import LoraBatch

Weight = torch.Tensor | Int4Weight
# projections that read the same input: with int4 weights each group is one kernel call
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class UnsupportedModelError(Exception):
    """The model directory holds something this engine cannot run."""


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_dir(cls, model_dir: Path) -> LlamaConfig:
        raw = json.loads((model_dir / "config.json").read_text())
        architectures = raw.get("architectures") or []
        if raw.get("model_type") != "llama" and "LlamaForCausalLM" not in architectures:
            raise UnsupportedModelError(f"model_type {raw.get('model_type')!r} is not Llama-family")
        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise UnsupportedModelError("attention/MLP biases are not supported")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise UnsupportedModelError(f"rope type {rope_type!r} is not supported")
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        heads = int(raw["num_attention_heads"])
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )

    def module_shape(self, name: str) -> tuple[int, int]:
        """(out_features, in_features) of a projection."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return {
            "q_proj": (q, self.hidden_size),
            "k_proj": (kv, self.hidden_size),
            "v_proj": (kv, self.hidden_size),
            "o_proj": (self.hidden_size, q),
            "gate_proj": (self.intermediate_size, self.hidden_size),
            "up_proj": (self.intermediate_size, self.hidden_size),
            "down_proj": (self.hidden_size, self.intermediate_size),
        }[name]


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor whose memory the OS provides as it is first written: an anonymous
    mapping (``mmap``) reads as zeros and takes resident memory page by page, so a cache
    sized for every slot at the full context costs what its sequences have written, not
    what it could hold (``torch.zeros`` writes, hence touches, every byte up front)."""
    n = 1
    for d in shape:
        n *= d
    size = n * torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(-1, max(size, 1))
    return torch.frombuffer(buf, dtype=dtype, count=n).view(shape)


class KVCache:
    """Keys and values of every slot: per layer a ``(slots, kv_heads, max_len, head_dim)``,
    zeros (masked-out positions still enter the weighted sum, with weight 0) that take
    memory as positions are written (``lazy_zeros``)."""

    def __init__(self, cfg: LlamaConfig, slots: int, max_len: int, dtype: torch.dtype) -> None:
        shape = (slots, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [lazy_zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.v = [lazy_zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.slots = slots
        self.max_len = max_len

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        for layer_k, layer_v in zip(self.k, self.v, strict=True):
            layer_k[dst, :, :length] = layer_k[src, :, :length]
            layer_v[dst, :, :length] = layer_v[src, :, :length]


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaModel:
    """Weights plus the prefill/decode forward passes. Not thread-safe: one owner thread."""

    def __init__(
        self, model_dir: Path, dtype: torch.dtype = torch.float32, int4: bool = False
    ) -> None:
        """``int4``: keep each projection whose weights lie on a 4-bit block grid (a
        Q4_0 / Q4_1 GGUF's) packed, the others ``dtype``, and compute the LM head in two
        passes, bfloat16 then float for the likeliest rows (engine/int4.py)."""
        self.cfg = LlamaConfig.from_dir(model_dir)
        self.dtype = dtype
        weights = _SafetensorsFiles(model_dir)
        cfg = self.cfg

        def take(name: str) -> torch.Tensor:
            return weights.read(name).to(dtype).contiguous()

        def projection(name: str) -> Weight:
            w = weights.read(name)
            packed = pack(w) if int4 else None
            return packed if packed is not None else w.to(dtype).contiguous()

        self.embed = take("model.embed_tokens.weight")
        if cfg.tie_word_embeddings or "lm_head.weight" not in weights:
            self.lm_head = self.embed
        else:
            self.lm_head = take("lm_head.weight")
        self.head = TwoPassHead.of(self.lm_head) if int4 else None
        self.norm = RMSNorm(take("model.norm.weight"), cfg.rms_norm_eps)
        self.layers: list[dict[str, Weight]] = []
        self.input_norms: list[RMSNorm] = []
        self.post_norms: list[RMSNorm] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            layer = {}
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                layer[proj] = projection(p + f"self_attn.{proj}.weight")
            for proj in ("gate_proj", "up_proj", "down_proj"):
                layer[proj] = projection(p + f"mlp.{proj}.weight")
            self.layers.append(layer)
            self.input_norms.append(RMSNorm(take(p + "input_layernorm.weight"), cfg.rms_norm_eps))
            self.post_norms.append(
                RMSNorm(take(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
            )
        self.int4_projections = sum(
            isinstance(w, Int4Weight) for layer in self.layers for w in layer.values()
        )
        self.fused = [_fuse(layer) for layer in self.layers]
        self.inv_freq = 1.0 / (
            cfg.rope_theta
            ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )

    # ---- building blocks ----------------------------------------------------------------

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape ``(N, head_dim)`` for flat positions ``(N,)``."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _linear(
        self, x: torch.Tensor, layer: int, name: str, lora: LoraBatch | None
    ) -> torch.Tensor:
        w = self.layers[layer][name]
        y = w(x) if isinstance(w, Int4Weight) else F.linear(x, w)
        if lora is not None:
            y = lora.apply(x, y, layer, name)
        return y

    def _shared(
        self, x: torch.Tensor, layer: int, names: tuple[str, ...], lora: LoraBatch | None
    ) -> list[torch.Tensor]:
        """The projections ``names`` of one input: with int4 weights one kernel call for
        the group (``_fuse``), split into each projection's output."""
        fused = self.fused[layer].get(names)
        if fused is None:
            return [self._linear(x, layer, name, lora) for name in names]
        widths = [self.layers[layer][name].out_features for name in names]  # type: ignore[union-attr]
        ys = list(fused(x).split(widths, dim=-1))
        if lora is not None:
            ys = [lora.apply(x, y, layer, name) for y, name in zip(ys, names, strict=True)]
        return ys

    def _mlp(self, x: torch.Tensor, layer: int, lora: LoraBatch | None) -> torch.Tensor:
        gate, up = self._shared(x, layer, ("gate_proj", "up_proj"), lora)
        return self._linear(F.silu(gate) * up, layer, "down_proj", lora)

    def _qkv(
        self,
        x: torch.Tensor,
        layer: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: LoraBatch | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q ``(N, H, D)``, k ``(N, KVH, D)``, and v ``(N, KVH, D)``."""
        cfg = self.cfg
        n = x.shape[0]
        q, k, v = self._shared(x, layer, ("q_proj", "k_proj", "v_proj"), lora)
        q = q.reshape(n, cfg.num_heads, cfg.head_dim)
        k = k.reshape(n, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(n, cfg.num_kv_heads, cfg.head_dim)
        c, s = cos[:, None, :], sin[:, None, :]
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        return q, k, v

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(hidden)
        return self.head(x) if self.head is not None else F.linear(x, self.lm_head).float()

    # ---- forward passes -----------------------------------------------------------------

    def prefill(
        self,
        input_ids: list[int],
        slot: int,
        cache: KVCache,
        lora: LoraBatch | None,
        start: int = 0,
    ) -> torch.Tensor:
        """One prompt: fill ``slot``'s cache, return last-position logits ``(V,)``."""
        return self.prefill_batch([(input_ids, slot, start)], cache, lora)[0]

    @torch.inference_mode()
    def prefill_batch(
        self,
        items: list[tuple[list[int], int, int]],
        cache: KVCache,
        lora: LoraBatch | None,
    ) -> torch.Tensor:
        """Prefill several prompts in one pass; returns last-position logits ``(B, V)``
        (``prefill_batch_full`` also returns every position's, for prompt logprobs).

        Each item is ``(input_ids, slot, start)``. With ``start > 0`` the slot already holds
        the keys and values of ``input_ids[:start]`` (a shared prefix copied from another
        slot): only the rest is computed, attending over the cached prefix. The prompts'
        new tokens are concatenated into one flat batch for the projections and the MLP
        (``lora`` rows follow that order); attention runs per prompt over its own slot.
        """
        return self.prefill_batch_full(items, cache, lora, [False] * len(items))[0]

    @torch.inference_mode()
    def prefill_batch_full(
        self,
        items: list[tuple[list[int], int, int]],
        cache: KVCache,
        lora: LoraBatch | None,
        full: list[bool],
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """``prefill_batch``, plus for each item with ``full`` set the logits of every
        position it computed (``start`` to the end: ``(n - start, V)``), None otherwise."""
        cfg = self.cfg
        group = cfg.num_heads // cfg.num_kv_heads
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        spans: list[tuple[int, int, int, int, int, torch.Tensor | None]] = []
        for input_ids, slot, start in items:
            n = len(input_ids)
            if not 0 <= start < n:
                raise ValueError(f"prefill start {start} must be in [0, {n})")
            lo = len(ids)
            ids.extend(input_ids[start:])
            positions.append(torch.arange(start, n))
            # query j (position start + j) sees keys 0..start + j
            mask = torch.arange(n)[None, :] <= positions[-1][:, None] if start else None
            spans.append((lo, len(ids), slot, start, n, mask))
        cos, sin = self._rope(torch.cat(positions))
        h = F.embedding(torch.tensor(ids, dtype=torch.long), self.embed)
        for i in range(cfg.num_layers):
            x = self.input_norms[i](h)
            q, k, v = self._qkv(x, i, cos, sin, lora)
            outs = []
            for lo, hi, slot, start, n, mask in spans:
                cache.k[i][slot, :, start:n] = k[lo:hi].transpose(0, 1)
                cache.v[i][slot, :, start:n] = v[lo:hi].transpose(0, 1)
                kk = cache.k[i][slot, :, :n].repeat_interleave(group, dim=0)
                vv = cache.v[i][slot, :, :n].repeat_interleave(group, dim=0)
                attn = F.scaled_dot_product_attention(
                    q[lo:hi].transpose(0, 1)[None],
                    kk[None],
                    vv[None],
                    attn_mask=mask,
                    is_causal=mask is None,
                )  # (1, H, hi - lo, D)
                outs.append(attn[0].transpose(0, 1).reshape(hi - lo, cfg.num_heads * cfg.head_dim))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            h = h + self._linear(attn, i, "o_proj", lora)
            h = h + self._mlp(self.post_norms[i](h), i, lora)
        last = torch.tensor([hi - 1 for _, hi, *_ in spans])
        every = [
            self._logits(h[lo:hi]) if want else None
            for (lo, hi, *_), want in zip(spans, full, strict=True)
        ]
        return self._logits(h[last]), every

    @torch.inference_mode()
    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        lora: LoraBatch | None,
    ) -> torch.Tensor:
        """One step for the sequences in slots ``0..B-1``.

        ``tokens[b]`` is the newest token of slot ``b`` and ``positions[b]`` its position
        (= the number of tokens already cached). Returns logits ``(B, V)``.
        """
        cfg = self.cfg
        b = tokens.shape[0]
        group = cfg.num_heads // cfg.num_kv_heads
        total = int(positions.max().item()) + 1
        rows = torch.arange(b)
        # mask[b, t]: slot b attends to its own positions 0..positions[b]
        mask = (torch.arange(total)[None, :] <= positions[:, None])[:, None, None, :]
        cos, sin = self._rope(positions)
        h = F.embedding(tokens, self.embed)
        for i in range(cfg.num_layers):
            x = self.input_norms[i](h)
            q, k, v = self._qkv(x, i, cos, sin, lora)
            cache.k[i][rows, :, positions] = k
            cache.v[i][rows, :, positions] = v
            keys = cache.k[i][:b, :, :total]  # (B, KVH, T, D), a view
            values = cache.v[i][:b, :, :total]
            # GQA without copying K/V: each kv head's query group acts as a query length.
            qg = q.view(b, cfg.num_kv_heads, group, cfg.head_dim)
            attn = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
            attn = attn.reshape(b, cfg.num_heads * cfg.head_dim)
            h = h + self._linear(attn, i, "o_proj", lora)
            h = h + self._mlp(self.post_norms[i](h), i, lora)
        return self._logits(h)


def _fuse(layer: dict[str, Weight]) -> dict[tuple[str, ...], Int4Weight]:
    """Each ``SHARED_INPUT`` group whose projections are all packed (in whole 64-row
    blocks), as one weight: the group's rows stacked (``Int4Weight.stack``). The group's
    members in ``layer`` become views of it (no second copy)."""
    fused = {}
    for names in SHARED_INPUT:
        parts = [layer[name] for name in names]
        if all(isinstance(w, Int4Weight) and w.out_features % ROW_BLOCK == 0 for w in parts):
            group = Int4Weight.stack(parts)  # type: ignore[arg-type]
            fused[names] = group
            for name, part in zip(names, group.split(parts), strict=True):  # type: ignore[arg-type]
                layer[name] = part
    return fused


class _SafetensorsFiles:
    """A model directory's safetensors, read one tensor at a time, so that loading holds
    the finished weights plus one tensor being converted, never a second full copy."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise UnsupportedModelError(f"no *.safetensors weights in {model_dir}")
        self.file_of: dict[str, Path] = {}
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                self.file_of.update(dict.fromkeys(f.keys(), path))

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def read(self, name: str) -> torch.Tensor:
        if name not in self.file_of:
            raise UnsupportedModelError(f"weight {name} missing in {self.model_dir}")
        with safe_open(str(self.file_of[name]), framework="pt") as f:
            return f.get_tensor(name)
