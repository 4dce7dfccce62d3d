"""The trainable policy: the engine's base weights + a PEFT LoRA adapter.

- Base weights come from ``engine.model_files.resolve_model_dir`` (identical to the
  engine's). CPU runs in float32, CUDA in bfloat16 (LoRA weights stay float32).
- Warm start from the serving adapter's directory; the optimizer state is saved next to
  the adapter (``optimizer.pt``) so periodic runs continue one optimization.
- Forward passes run length-sorted, right-padded micro-batches (similar lengths share a
  batch, so little is padding) and apply the LM head only at the positions that predict
  sampled tokens. Samples with the same prompt (a GRPO group) forward it once and reuse
  its KV cache for their completions. With ``merge_turns`` the turns of a session that
  extend each other are one row (trainer/merge.py: the loss is unchanged). (Packing
  unrelated sequences into one row would need a varlen attention kernel; with a
  block-diagonal mask, attention over a 4k-token row costs far more than the model
  itself for agent-length samples on CPU.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.config import TrainConfig
from trainer.data import Sample
from trainer.loss import token_entropy, token_logprobs
from trainer.merge import chains, merged_turns

log = logging.getLogger("rlgate.trainer")

OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"


def pick_device() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


@dataclass
class MicroBatch:
    """Samples forwarded together, as ``rows``: one row per sample, or one row per chain
    of turns merged by trainer/merge.py (the chain's last turn holds the others as a
    prefix). ``samples`` is the rows' samples in order; logprobs come back in that order.
    Samples that share a prompt (a GRPO group, rows of one sample each) share its
    forward: the prompt runs once and its KV cache serves every completion."""

    samples: list[Sample]
    rows: list[list[Sample]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [[s] for s in self.samples]
        flat = [s for r in self.rows for s in r]
        assert len(flat) == len(self.samples)
        assert all(a is b for a, b in zip(flat, self.samples, strict=True))

    @classmethod
    def of_rows(cls, rows: list[list[Sample]]) -> MicroBatch:
        return cls([s for r in rows for s in r], rows)

    @property
    def tokens(self) -> int:
        """Tokens of the samples (each turn's prompt + completion)."""
        return sum(s.length for s in self.samples)

    @property
    def forward_tokens(self) -> int:
        """Tokens the forward computes, padding aside: a shared prompt once, a merged
        row once."""
        if self.shares_prompts:
            prompts = {tuple(s.prompt_ids) for s in self.samples}
            return sum(map(len, prompts)) + sum(len(s.completion_ids) for s in self.samples)
        return sum(r[-1].length for r in self.rows)

    @property
    def padded_tokens(self) -> int:
        return _cost(self.rows)

    @property
    def merged_turns(self) -> int:
        return merged_turns(self.rows)

    @property
    def shares_prompts(self) -> bool:
        if any(len(r) > 1 for r in self.rows):
            return False
        return len({tuple(s.prompt_ids) for s in self.samples}) < len(self.samples)


def _cost(rows: list[list[Sample]]) -> int:
    """Tokens a forward computes: one padded row per distinct prompt, then (when prompts
    repeat and nothing is merged) one padded row per completion; otherwise one padded row
    per sample or merged chain."""
    samples = [s for r in rows for s in r]
    prompts = {tuple(s.prompt_ids) for s in samples}
    if len(prompts) == len(samples) or len(rows) < len(samples):
        return len(rows) * max(r[-1].length for r in rows)
    longest_prompt = max(len(p) for p in prompts)
    longest_completion = max(len(s.completion_ids) for s in samples)
    return len(prompts) * longest_prompt + len(samples) * longest_completion


def make_micro_batches(samples: list[Sample], budget: int, merge: bool = False) -> list[MicroBatch]:
    """Samples with the same prompt stay together, and so do (with ``merge``) the turns of
    a session merged into one row (trainer/merge.py); these units go longest first into
    batches while the batch's forward stays within ``budget`` tokens (a unit over the
    budget gets a batch of its own). A merged row is as long as its last turn's own row."""
    rows = chains(samples) if merge else [[s] for s in samples]
    groups: dict[tuple[int, ...], list[list[Sample]]] = {}
    merged: list[list[list[Sample]]] = []
    for row in rows:
        if len(row) > 1:
            merged.append([row])
        else:
            groups.setdefault(tuple(row[0].prompt_ids), []).append(row)
    units = list(groups.values()) + merged
    ordered = sorted(units, key=lambda u: max(r[-1].length for r in u), reverse=True)
    batches: list[list[list[Sample]]] = []
    for unit in ordered:
        if batches and _cost(batches[-1] + unit) <= budget:
            batches[-1].extend(unit)
        else:
            batches.append(list(unit))
    return [MicroBatch.of_rows(b) for b in batches]


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

    # ---- loading / saving ------------------------------------------------------------

    @classmethod
    def load(cls, model_dir: Path, cfg: TrainConfig, warm_start: Path | None = None) -> Policy:
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM

        device, dtype = pick_device()
        torch.manual_seed(cfg.seed)
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device)
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
        return cls(model, device, source)

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
        forward = self.shared_prompt_hidden if batch.shares_prompts else self.padded_hidden
        return self._head(forward(batch), batch.samples, entropy_grad)

    def shared_prompt_logprobs(self, batch: MicroBatch) -> list[torch.Tensor]:
        return self._head(self.shared_prompt_hidden(batch), batch.samples)[0]

    def padded_logprobs(self, batch: MicroBatch) -> list[torch.Tensor]:
        return self._head(self.padded_hidden(batch), batch.samples)[0]

    def _head(
        self, h: torch.Tensor, samples: list[Sample], entropy_grad: bool | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """LM head on the hidden states that predict each sampled token, then logprobs."""
        targets = [t for s in samples for t in s.completion_ids]
        temps = torch.tensor([s.temperature for s in samples for _ in s.completion_ids])
        dev = self.device
        logits = self.model.get_base_model().get_output_embeddings()(h)
        lp = token_logprobs(logits, torch.tensor(targets, device=dev), temps.to(dev))
        sizes = [len(s.completion_ids) for s in samples]
        if entropy_grad is None:
            return list(lp.split(sizes)), None
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = token_entropy(logits if entropy_grad else logits.detach(), temps.to(dev))
        return list(lp.split(sizes)), list(ent.split(sizes))

    def shared_prompt_hidden(self, batch: MicroBatch) -> torch.Tensor:
        """Each distinct prompt is forwarded once; its KV cache (still in the autograd
        graph, so prompt positions get their gradient from every completion) is then
        repeated for the completions that follow it."""
        samples, dev = batch.samples, self.device
        decoder = self.model.get_base_model().get_decoder()
        index: dict[tuple[int, ...], int] = {}
        for s in samples:
            index.setdefault(tuple(s.prompt_ids), len(index))
        prompts = list(index)
        p_width = max(len(p) for p in prompts)
        p_ids = torch.zeros(len(prompts), p_width, dtype=torch.long)
        p_att = torch.zeros(len(prompts), p_width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            p_ids[row, : len(prompt)] = torch.tensor(prompt)
            p_att[row, : len(prompt)] = 1
        out = decoder(input_ids=p_ids.to(dev), attention_mask=p_att.to(dev), use_cache=True)
        rows = torch.tensor([index[tuple(s.prompt_ids)] for s in samples], device=dev)
        cache = out.past_key_values
        cache.reorder_cache(rows)  # row r: its sample's prompt (index_select, differentiable)
        c_width = max(len(s.completion_ids) for s in samples)
        c_ids = torch.zeros(len(samples), c_width, dtype=torch.long)
        att = torch.zeros(len(samples), p_width + c_width, dtype=torch.long)
        pos = torch.zeros(len(samples), c_width, dtype=torch.long)
        for r, s in enumerate(samples):
            c_ids[r, : len(s.completion_ids)] = torch.tensor(s.completion_ids)
            att[r, : len(s.prompt_ids)] = 1
            att[r, p_width : p_width + len(s.completion_ids)] = 1
            pos[r] = torch.arange(len(s.prompt_ids), len(s.prompt_ids) + c_width)
        c_hidden = decoder(
            input_ids=c_ids.to(dev),
            attention_mask=att.to(dev),
            position_ids=pos.to(dev),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        # token 0 is predicted by the prompt's last position, token j by completion j - 1
        p_flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        c_flat = c_hidden.reshape(-1, c_hidden.shape[-1])
        pieces = []
        for r, s in enumerate(samples):
            last = int(rows[r]) * p_width + len(s.prompt_ids) - 1
            pieces.append(p_flat[last : last + 1])
            pieces.append(c_flat[r * c_width : r * c_width + len(s.completion_ids) - 1])
        return torch.cat(pieces)

    def padded_hidden(self, batch: MicroBatch) -> torch.Tensor:
        """One right-padded row per sample (prompt + completion), or per merged chain (its
        last turn's prompt + completion), read at the positions that predict each turn's
        sampled tokens: never at the tokens between turns (trainer/merge.py)."""
        width = max(r[-1].length for r in batch.rows)
        ids = torch.zeros(len(batch.rows), width, dtype=torch.long)
        attention = torch.zeros(len(batch.rows), width, dtype=torch.long)
        gather: list[int] = []
        for i, row in enumerate(batch.rows):
            last = row[-1]
            ids[i, : last.length] = torch.tensor(last.prompt_ids + last.completion_ids)
            attention[i, : last.length] = 1
            for s in row:
                start = i * width + len(s.prompt_ids) - 1  # position predicting token 0
                gather.extend(range(start, start + len(s.completion_ids)))
        dev = self.device
        causal = self.model.get_base_model()
        hidden = causal.get_decoder()(
            input_ids=ids.to(dev), attention_mask=attention.to(dev), use_cache=False
        ).last_hidden_state
        return hidden.reshape(-1, hidden.shape[-1]).index_select(
            0, torch.tensor(gather, device=dev)
        )

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
