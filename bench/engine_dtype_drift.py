"""How far the embedded engine's logprobs move with cheaper weights, against float32.

    .venv/bin/python bench/engine_dtype_drift.py --data-dir /tmp/bench-data

The float32 engine model greedily continues ``engine_vs_llamacpp``'s four prompts for
``--max-new-tokens`` tokens; then each variant is teacher-forced over the same tokens
(prefill, then one decode step per token, as the engine serves) and compared with
float32: how many of its argmax tokens agree, and the mean and largest absolute
difference of the chosen tokens' logprobs. Variants:

* ``bfloat16``: the engine's ``--dtype bfloat16`` (weights, activations and KV cache);
* ``int4``: the engine's ``--weights int4`` (engine/int4.py: the GGUF's 4-bit projection
  weights kept packed, bfloat16 activations at each projection, the rest float32);
* ``int8-dynamic``: an experiment, not an engine option: every projection and the LM
  head as PyTorch's dynamically quantized int8 linear (int8 per-output-channel weights,
  activations quantized per tensor at run time, fbgemm), the rest float32.

For RL the logprobs matter as much as the speed: the engine's logprobs are the behaviour
policy's, and the trainer recomputes them in float32.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from engine_vs_llamacpp import QUESTIONS, _prompt  # bench/, this script's directory

from engine.llama import KVCache, LlamaModel
from engine.model_files import PACKAGED_MODEL, resolve_model_dir


def _int8_dynamic(model: LlamaModel) -> None:
    """Swap every float32 projection and the LM head for a dynamic int8 linear."""

    def pack(w: torch.Tensor) -> torch.Tensor:
        scale = (w.abs().amax(dim=1).clamp(min=1e-8) / 127.0).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None)

    packed = [{name: pack(w) for name, w in layer.items()} for layer in model.layers]
    head = pack(model.lm_head)

    def linear(x, layer, name, lora):  # noqa: ANN001, ANN202 - replaces LlamaModel._linear
        return torch.ops.quantized.linear_dynamic(x, packed[layer][name], True)

    def logits(hidden):  # noqa: ANN001, ANN202 - replaces LlamaModel._logits
        return torch.ops.quantized.linear_dynamic(model.norm(hidden), head, True).float()

    model._linear = linear  # type: ignore[method-assign]
    model._logits = logits  # type: ignore[method-assign]


def _teacher_forced(model: LlamaModel, prompt: list[int], tokens: list[int]) -> tuple:
    """Logprobs of ``tokens`` after ``prompt``, and each step's argmax."""
    cache = KVCache(model.cfg, 1, len(prompt) + len(tokens) + 1, model.dtype)
    logits = model.prefill(prompt, 0, cache, None)
    logprobs, argmax = [], []
    for i, tok in enumerate(tokens):
        lp = torch.log_softmax(logits.float(), dim=-1)
        logprobs.append(float(lp[tok]))
        argmax.append(int(lp.argmax()))
        pos = torch.tensor([len(prompt) + i])
        logits = model.decode(torch.tensor([tok]), pos, cache, None)[0]
    return torch.tensor(logprobs), argmax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data-dir", default=os.environ.get("RLGATE_DATA_DIR", "./rlgate-data"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    model_dir = resolve_model_dir(PACKAGED_MODEL, Path(args.data_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = [list(tokenizer(_prompt(i))["input_ids"]) for i in range(len(QUESTIONS))]

    reference = LlamaModel(model_dir, dtype=torch.float32)
    continuations = []
    for prompt in prompts:  # float32 greedy continuation
        cache = KVCache(reference.cfg, 1, len(prompt) + args.max_new_tokens + 1, torch.float32)
        logits = reference.prefill(prompt, 0, cache, None)
        tokens: list[int] = []
        for _ in range(args.max_new_tokens):
            tokens.append(int(logits.argmax()))
            pos = torch.tensor([len(prompt) + len(tokens) - 1])
            logits = reference.decode(torch.tensor([tokens[-1]]), pos, cache, None)[0]
        continuations.append(tokens)
    base = [_teacher_forced(reference, p, t) for p, t in zip(prompts, continuations, strict=True)]

    variants = {"bfloat16": LlamaModel(model_dir, dtype=torch.bfloat16)}
    variants["int4"] = LlamaModel(model_dir, dtype=torch.float32, int4=True)
    variants["int8-dynamic"] = LlamaModel(model_dir, dtype=torch.float32)
    _int8_dynamic(variants["int8-dynamic"])
    total = sum(len(t) for t in continuations)
    print(f"{len(prompts)} prompts x {args.max_new_tokens} float32-greedy tokens, teacher-forced")
    print(f"{'variant':14s} {'argmax = float32':>17s} {'|dlogprob| mean':>16s} {'max':>7s}")
    for name, model in variants.items():
        runs = [_teacher_forced(model, p, t) for p, t in zip(prompts, continuations, strict=True)]
        pairs = zip(runs, base, strict=True)
        agree = sum(a == b for (_, am), (_, bm) in pairs for a, b in zip(am, bm, strict=True))
        diff = torch.cat([lp - blp for (lp, _), (blp, _) in zip(runs, base, strict=True)]).abs()
        print(f"{name:14s} {agree:>9d} of {total:<5d} {diff.mean():16.4f} {diff.max():7.3f}")


if __name__ == "__main__":
    main()
