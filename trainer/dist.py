"""Where a training process stands in its run: one process, or rank ``rank`` of ``world``
started by torchrun (trainer/launch.py). The optimization loop (trainer/train.py) is the
same code either way; with ``world > 1`` it forwards only this rank's share of each step's
samples and calls the few collectives here:

- ``all_reduce_grads``: the LoRA gradients, summed. Each rank's loss is already divided
  by the whole step's token (or sequence) count, so the sum is the one-process gradient.
- ``gather``: any picklable value from every rank (logprobs by sample, loss metrics),
  in rank order, on every rank, so that every rank takes the same decisions (the trust
  region's stop, the gradient clip) from the same numbers.
- ``shard``: FSDP2's ``fully_shard`` on each decoder layer: the frozen base weights are
  split across the ranks and gathered layer by layer for the forward and the backward.
  The LoRA parameters are left out of the sharding (``ignored_params``): they are small
  (docs/scaling.md), every rank holds them and the same AdamW state, and rank 0 saves
  them exactly as a one-process run does.

FSDP gathers a layer's weights with a collective each time the layer runs, so every rank
must run its layers equally often: ranks forward their micro-batches as plain padded rows
(one decoder call each, trainer/policy.py ``plain_forward``) and a rank with fewer
micro-batches than another runs a zero-weighted one (trainer/train.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, backend: str, timeout_s: float = 1800.0) -> Dist:
        """Join the process group torchrun described in the environment."""
        import torch.distributed as td

        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: use one of {BACKENDS}")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if torch.cuda.is_available():
            torch.cuda.set_device(local % torch.cuda.device_count())
        td.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return cls(rank, world, local)

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def all_reduce_grads(self, params: list[torch.Tensor]) -> None:
        """Sum the gradients of ``params`` over the ranks (one flat collective)."""
        if not self.on:
            return
        import torch.distributed as td

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        td.all_reduce(flat)
        for p, piece in zip(params, flat.split([g.numel() for g in grads]), strict=True):
            p.grad = piece.view_as(p).clone()

    def broadcast_(self, params: list[torch.Tensor]) -> None:
        """Rank 0's values of ``params`` on every rank."""
        if not self.on:
            return
        import torch.distributed as td

        with torch.no_grad():
            for p in params:
                td.broadcast(p.data, src=0)

    def gather(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order (tensors come back on the CPU)."""
        if not self.on:
            return [value]
        import torch.distributed as td

        out: list[Any] = [None] * self.world
        td.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        if self.on:
            import torch.distributed as td

            td.barrier()

    def close(self) -> None:
        if self.on:
            import torch.distributed as td

            td.destroy_process_group()

    def shard(self, model: Any, lora_params: list[torch.nn.Parameter]) -> None:
        """FSDP2 over the frozen base: one ``fully_shard`` per decoder layer."""
        if not self.on:
            return
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dev = self.device()
        mesh = init_device_mesh(dev.type, (self.world,))
        ignored = set(lora_params)
        # each layer is a root of its own (nothing above it is sharded: the embeddings,
        # the final norm and the LM head stay whole), and a root keeps its gathered
        # weights after the forward unless told otherwise: the whole base would then be
        # gathered on every rank
        for layer in model.get_base_model().get_decoder().layers:
            fully_shard(layer, mesh=mesh, ignored_params=ignored, reshard_after_forward=True)


LOCAL = Dist()


def split_even(costs: list[int], world: int) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``world`` parts, largest first to the part with the
    least so far (ties: the lower rank); each part's indices in their original order."""
    parts: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        r = min(range(world), key=lambda r: (load[r], len(parts[r]), r))
        parts[r].append(i)
        load[r] += costs[i]
    return [sorted(p) for p in parts]
