"""The trainable policy: the engine's base weights + a PEFT LoRA adapter.

- Base weights come from ``engine.model_files.resolve_model_dir`` (identical to the
  engine's). CPU runs in float32, CUDA in bfloat16 (LoRA weights stay float32).
- Warm start from the serving adapter's directory; the optimizer state is saved next to
  the adapter (``optimizer.pt``) so periodic runs continue one optimization.
- Forward passes run length-sorted, right-padded micro-batches (similar lengths share a
  batch, so little is padding; trainer/forward.py) and apply the LM head only at the
  positions that predict sampled tokens. The longest token prefix common to all of a
  micro-batch's rows (a system prompt, tool specs) is forwarded once and its KV cache
  expanded to the rows; samples with the same prompt (a GRPO group) forward it once and
  reuse its KV cache for their completions. With ``merge_turns`` the turns of a session
  that extend each other are one row (trainer/merge.py: the loss is unchanged). (Packing
  unrelated sequences into one row would need a varlen attention kernel; with a
  block-diagonal mask, attention over a 4k-token row costs far more than the model
  itself for agent-length samples on CPU.)
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch

from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.dist import LOCAL, Dist
from trainer.forward import (
    MIN_SHARED_PREFIX,
    MicroBatch,
    _cost,
    make_micro_batches,
    padded_hidden,
    shared_prompt_hidden,
)
from trainer.loss import log_softmax_at


class TeacherScores(NamedTuple):
    """A teacher's view of one answer, per sampled position: the sampled token's log-prob
    [L], and its ``k`` likeliest tokens [L, k] with their log-probs [L, k] (k = 0: none)."""

    logp: torch.Tensor
    top_index: torch.Tensor
    top_logp: torch.Tensor

    def to(self, device: torch.device | str) -> TeacherScores:
        return TeacherScores(*(t.to(device) for t in self))


class HeadOut(NamedTuple):
    """Per sample: the sampled tokens' log-probs, the entropy at their positions (or None),
    and the log-probs at the indices asked for (None where none were asked)."""

    logprobs: list[torch.Tensor]
    entropy: list[torch.Tensor] | None
    at: list[torch.Tensor | None]


__all__ = [
    "MIN_SHARED_PREFIX",
    "HeadOut",
    "MicroBatch",
    "Policy",
    "TeacherScores",
    "_cost",
    "make_micro_batches",
]

log = logging.getLogger("rlgate.trainer")

OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"


def pick_device() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def lora_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return {
        "r": cfg.lora_rank,
        "lora_alpha": cfg.lora_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": sorted(cfg.target_modules),
    }


class Policy:
    def __init__(self, model: Any, device: torch.device, warm_started_from: str | None) -> None:
        self.model = model  # a peft.PeftModel
        self.device = device
        self.warm_started_from = warm_started_from
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.param_names = [n for n, p in model.named_parameters() if p.requires_grad]
        # every micro-batch as plain padded rows, one decoder call each (trainer/dist.py:
        # FSDP needs every rank to run its layers equally often)
        self.plain_forward = False

    # ---- loading / saving ------------------------------------------------------------

    @classmethod
    def load(
        cls,
        model_dir: Path,
        cfg: TrainConfig,
        warm_start: Path | None = None,
        dist: Dist = LOCAL,
    ) -> Policy:
        """The base with its adapter; with ``dist.on`` each rank loads the base on the CPU
        and keeps its FSDP shard of each decoder layer on its device (trainer/dist.py)."""
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM

        device, dtype = pick_device()
        torch.manual_seed(cfg.seed)
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        if dist.on:
            device = dist.device()
        else:
            base = base.to(device)
        base.config.use_cache = False
        source = None
        if warm_start is not None and _compatible(warm_start, cfg):
            model = PeftModel.from_pretrained(base, str(warm_start), is_trainable=True)
            source = str(warm_start)
        else:
            if warm_start is not None:
                log.warning("LoRA config changed since %s: starting a fresh adapter", warm_start)
            lc = LoraConfig(
                r=cfg.lora_rank,
                lora_alpha=cfg.lora_alpha,
                lora_dropout=cfg.lora_dropout,
                target_modules=list(cfg.target_modules),
                bias="none",
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(base, lc)
        policy = cls(model, device, source)
        if dist.on:
            dist.shard(model, policy.params)
            model.to(device)
            dist.broadcast_(policy.params)  # one starting adapter, whatever each rank drew
            policy.plain_forward = True
        return policy

    def make_optimizer(self, cfg: TrainConfig, warm_start: Path | None) -> torch.optim.Optimizer:
        opt = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
        if warm_start is None or self.warm_started_from is None:
            return opt
        opt_file, state_file = warm_start / OPTIMIZER_FILE, warm_start / STATE_FILE
        if opt_file.is_file() and state_file.is_file():
            names = json.loads(state_file.read_text()).get("param_names")
            if names == self.param_names:
                state = torch.load(opt_file, map_location=self.device, weights_only=True)
                opt.load_state_dict(state)
                for group in opt.param_groups:  # this run's hyperparameters win
                    group.update(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
            else:
                log.warning("optimizer state in %s does not fit: fresh optimizer", warm_start)
        return opt

    def save(self, out_dir: Path, opt: torch.optim.Optimizer, extra: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out_dir), safe_serialization=True)
        torch.save(opt.state_dict(), out_dir / OPTIMIZER_FILE)
        state = {"param_names": self.param_names, **extra}
        (out_dir / STATE_FILE).write_text(json.dumps(state, indent=1))

    # ---- forward ---------------------------------------------------------------------

    def batch_logprobs(self, batch: MicroBatch) -> list[torch.Tensor]:
        """Per sample, logprobs of its completion tokens under the current model (with the
        gradient if enabled), at each sample's recorded temperature."""
        return self.batch_logprobs_entropy(batch, None)[0]

    def batch_logprobs_entropy(
        self, batch: MicroBatch, entropy_grad: bool | None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Logprobs as :meth:`batch_logprobs`, and (unless ``entropy_grad`` is None) the
        policy's entropy at each sampled position, with its gradient if ``entropy_grad``."""
        out = self.forward(batch, entropy_grad)
        return out.logprobs, out.entropy

    def forward(
        self,
        batch: MicroBatch,
        entropy_grad: bool | None = None,
        at: list[torch.Tensor | None] | None = None,
    ) -> HeadOut:
        """The batch's decoder forward and :meth:`head`; ``at``: per sample, token indices
        [L, k] whose log-probs to return at each sampled position (None: not for it)."""
        return self.head(self.hidden(batch), batch.samples, entropy_grad, at)

    def hidden(self, batch: MicroBatch) -> torch.Tensor:
        """The decoder's hidden states that predict each sampled token, in order."""
        if self.plain_forward:
            return self.padded_hidden(batch, 0)
        forward = self.shared_prompt_hidden if batch.shares_prompts else self.padded_hidden
        return forward(batch, batch.prefix)

    def head(
        self,
        h: torch.Tensor,
        samples: list[Sample],
        entropy_grad: bool | None = None,
        at: list[torch.Tensor | None] | None = None,
    ) -> HeadOut:
        """LM head on the hidden states that predict each sampled token: their log-probs at
        each sample's temperature, the entropy there, and the log-probs at ``at``."""
        dev = self.device
        logp, lp, sizes = self._log_softmax(h, samples)
        picked: list[torch.Tensor | None] = [None] * len(samples)
        if at is not None:
            for i, (rows, idx) in enumerate(zip(logp.split(sizes), at, strict=True)):
                if idx is not None:
                    picked[i] = rows.gather(-1, idx.to(dev))
        if entropy_grad is None:
            return HeadOut(list(lp.split(sizes)), None, picked)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            src = logp if entropy_grad else logp.detach()
            ent = -(src.exp() * src).sum(-1)
        return HeadOut(list(lp.split(sizes)), list(ent.split(sizes)), picked)

    def _log_softmax(
        self, h: torch.Tensor, samples: list[Sample]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The LM head's log-probs at each sample's temperature [N, V], the sampled tokens'
        [N], and the samples' completion lengths (N = their sum)."""
        dev = self.device
        targets = torch.tensor([t for s in samples for t in s.completion_ids], device=dev)
        temps = torch.tensor([s.temperature for s in samples for _ in s.completion_ids])
        logits = self.model.get_base_model().get_output_embeddings()(h)
        logp = log_softmax_at(logits, temps.to(dev))
        lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return logp, lp, [len(s.completion_ids) for s in samples]

    def shared_prompt_hidden(self, batch: MicroBatch, prefix: int = 0) -> torch.Tensor:
        return shared_prompt_hidden(self._decoder(), batch, self.device, prefix)

    def padded_hidden(self, batch: MicroBatch, prefix: int = 0) -> torch.Tensor:
        return padded_hidden(self._decoder(), batch, self.device, prefix)

    def _decoder(self) -> Any:
        return self.model.get_base_model().get_decoder()

    @torch.no_grad()
    def logprobs(self, batches: list[MicroBatch], adapter: bool = True) -> dict[str, torch.Tensor]:
        """No-gradient logprobs by interaction id (proximal, or base with the adapter off)."""
        was_training = self.model.training
        self.model.eval()
        out: dict[str, torch.Tensor] = {}
        try:
            for batch in batches:
                if adapter:
                    lps = self.batch_logprobs(batch)
                else:
                    with self.model.disable_adapter():
                        lps = self.batch_logprobs(batch)
                for s, lp in zip(batch.samples, lps, strict=True):
                    out[s.interaction_id] = lp.float()
        finally:
            self.model.train(was_training)
        return out

    @torch.no_grad()
    def teacher_scores(
        self, batches: list[MicroBatch], adapter: bool, k: int
    ) -> dict[str, TeacherScores]:
        """No-gradient :class:`TeacherScores` by interaction id: each sampled token's
        log-prob and the ``k`` likeliest tokens at its position (adapter on or off)."""
        was_training = self.model.training
        self.model.eval()
        out: dict[str, TeacherScores] = {}
        try:
            for batch in batches:
                with contextlib.nullcontext() if adapter else self.model.disable_adapter():
                    logp, lp, sizes = self._log_softmax(self.hidden(batch), batch.samples)
                top = logp.topk(k, dim=-1)  # k = 0: empty [N, 0]
                for s, a, b, c in zip(
                    batch.samples,
                    lp.split(sizes),
                    top.indices.split(sizes),
                    top.values.split(sizes),
                    strict=True,
                ):
                    out[s.interaction_id] = TeacherScores(a.float(), b, c.float())
        finally:
            self.model.train(was_training)
        return out


def _compatible(adapter_dir: Path, cfg: TrainConfig) -> bool:
    try:
        saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return False
    targets = saved.get("target_modules") or []
    return (
        int(saved.get("r", -1)) == cfg.lora_rank
        and float(saved.get("lora_alpha", -1)) == float(cfg.lora_alpha)
        and sorted(targets) == sorted(cfg.target_modules)
    )
