"""Projection weights kept as 4-bit blocks, multiplied by PyTorch's int4 CPU kernel.

A GGUF quantized as Q4_0 or Q4_1 (the packaged SmolLM2-135M's projections are Q4_1)
stores each block of 32 weights along the input axis as 16 evenly spaced values:
``w = min + step * q`` with ``q`` in 0..15. Converted to float32 safetensors, the values
are still exactly those. ``pack`` finds that grid again and keeps the weights as the 4-bit
``q`` plus a step and an offset per block (0.6 bytes a weight instead of float32's 4),
and ``Int4Weight`` multiplies with ``torch.ops.aten._weight_int4pack_mm_for_cpu``, which
dequantizes block by block inside the matmul. A decode step reads all its weights once,
so at batch 1 it is bound by memory traffic, which the packed weights cut
(docs/engine.md, "Weights"). The LM head is computed in two passes (``TwoPassHead``): a
bfloat16 copy ranks the vocabulary, the likeliest rows are recomputed in float.

What this changes in the arithmetic: the kernel takes bfloat16 activations, steps and
offsets and returns bfloat16, so a projection's input and output are rounded to
bfloat16 (8-bit mantissa), and each block's step and offset too. The weights' 4-bit
codes are exact. Everything else (the residual stream, norms, RoPE, attention, the LM
head's likeliest rows and so the sampled tokens' logits) stays in the engine's dtype.
``bench/engine_dtype_drift.py`` measures how far the logprobs move.

A matrix that is not on such a grid (a float checkpoint, another GGUF type) stays a
float tensor: ``pack`` returns None, so no weight is ever moved to fit a grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK = 32  # weights per block along the input axis (GGUF's Q4_0 / Q4_1 block size)
LEVELS = 16
CHUNK_ROWS = 4096  # rows checked and packed at a time (a multiple of the kernel's 64)
ROW_BLOCK = 64  # the kernel packs rows in blocks of 64 when their number allows


@dataclass(frozen=True)
class Int4Weight:
    """A ``(out_features, in_features)`` weight as 4-bit codes, steps and offsets."""

    packed: torch.Tensor  # uint8 (out, in / 2), the kernel's layout
    steps_offsets: torch.Tensor  # bfloat16 (in / BLOCK, out, 2)
    out_features: int
    in_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x`` of shape ``(..., in_features)``, in ``x``'s dtype."""
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, BLOCK, self.steps_offsets)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def stack(cls, parts: list[Int4Weight]) -> Int4Weight:
        """Weights of the same inputs as one, their output rows one after another (each
        part's rows a whole number of the kernel's row blocks, so the layouts join)."""
        if any(w.out_features % ROW_BLOCK for w in parts):
            raise ValueError(f"stacked weights need rows in multiples of {ROW_BLOCK}")
        return cls(
            packed=torch.cat([w.packed for w in parts]),
            steps_offsets=torch.cat([w.steps_offsets for w in parts], dim=1),
            out_features=sum(w.out_features for w in parts),
            in_features=parts[0].in_features,
        )

    def split(self, parts: list[Int4Weight]) -> list[Int4Weight]:
        """``stack``'s inverse, as views of this weight's codes."""
        out, row = [], 0
        for w in parts:
            rows = slice(row, row + w.out_features)
            out.append(
                Int4Weight(
                    packed=self.packed[rows],
                    steps_offsets=self.steps_offsets[:, rows].contiguous(),
                    out_features=w.out_features,
                    in_features=w.in_features,
                )
            )
            row += w.out_features
        return out

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.steps_offsets.nbytes


def pack(weight: torch.Tensor) -> Int4Weight | None:
    """The weight as ``Int4Weight`` if every block of ``BLOCK`` inputs holds values
    ``min + step * q`` (``q`` in 0..15), each within float32 rounding of its grid point
    (a thousandth of a step); None otherwise."""
    return _pack_rows(weight)


Grid = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # codes, steps, offsets


def _grid_4bit(blocks: torch.Tensor) -> Grid | None:
    low = blocks.amin(-1, keepdim=True)
    step = (blocks.amax(-1, keepdim=True) - low) / (LEVELS - 1)
    q = torch.round((blocks - low) / torch.where(step > 0, step, 1.0)).clamp(0, LEVELS - 1)
    if not _on_grid(q * step + low, blocks, step):
        return None
    # the kernel dequantizes (q - 8) * step + offset
    return q.flatten(1), step, low + 8 * step


@dataclass(frozen=True)
class TwoPassHead:
    """The LM head in two passes: a bfloat16 copy of the weight ranks the vocabulary,
    then the ``exact_top`` likeliest tokens of each row are recomputed from the float
    weight. The first pass's bfloat16 output would round a logit of 20 by up to 0.04;
    so the tokens that are sampled and whose logprobs are returned get float logits,
    and only the rest (far below them in probability) keep the rounded ones. A row's
    logits do not depend on the rows beside it up to 16 (measured; a decode step's
    default most); at 64 the matmul's blocking rounded a tail logit one bfloat16 step
    differently. For the packaged model's head (49152 x 576), one row: 2.1 ms against
    float32's 2.5; 16 rows: 2.2 ms against 8.8 (a bfloat16 matmul here is not bound by
    computing, as the int4 kernel is past one row: the head's Q8_0 values as two 4-bit
    halves took 11.4 ms at 16 rows)."""

    rough: torch.Tensor  # (vocab, hidden), bfloat16: the first pass
    weight: torch.Tensor  # (vocab, hidden), float: the exact rows
    exact_top: int = 256

    @classmethod
    def of(cls, weight: torch.Tensor) -> TwoPassHead:
        return cls(weight.to(torch.bfloat16).contiguous(), weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(..., vocab)`` in float32 for ``x`` of shape ``(..., hidden)``."""
        flat = x.reshape(-1, x.shape[-1])
        logits = F.linear(flat.to(torch.bfloat16), self.rough).float()
        top = logits.topk(min(self.exact_top, logits.shape[-1]), dim=-1).indices
        exact = torch.einsum("mh,mkh->mk", flat, self.weight[top]).float()
        logits.scatter_(-1, top, exact)
        return logits.reshape(*x.shape[:-1], -1)


def _pack_rows(weight: torch.Tensor) -> Int4Weight | None:
    """``_grid_4bit`` applied to ``CHUNK_ROWS`` rows at a time (a large matrix's
    temporaries stay small), each chunk packed into the kernel's layout, which keeps
    blocks of 64 rows apart (a matrix whose rows are not a multiple of 64 is packed
    whole); None for a shape the kernel refuses (rows not a multiple of 16, inputs not
    of ``BLOCK``) or a chunk off the grid."""
    if weight.dim() != 2 or weight.shape[1] % BLOCK or weight.shape[0] % 16:
        return None
    packed, steps, offsets = [], [], []
    # chunks join only when the kernel packs the whole in 64-row blocks
    chunk = CHUNK_ROWS if weight.shape[0] % ROW_BLOCK == 0 else weight.shape[0]
    for rows in weight.detach().split(chunk):
        found = _grid_4bit(rows.to(torch.float32).reshape(rows.shape[0], -1, BLOCK))
        if found is None:
            return None
        codes, step, offset = found
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1))
        steps.append(step.squeeze(-1))
        offsets.append(offset.squeeze(-1))
    steps_offsets = torch.stack((torch.cat(steps).T, torch.cat(offsets).T), -1)
    return Int4Weight(
        packed=torch.cat(packed),
        steps_offsets=steps_offsets.to(torch.bfloat16).contiguous(),
        out_features=weight.shape[0],
        in_features=codes.shape[1],
    )


def _on_grid(rebuilt: torch.Tensor, blocks: torch.Tensor, step: torch.Tensor) -> bool:
    return bool(((rebuilt - blocks).abs() <= 1e-3 * step).all())
