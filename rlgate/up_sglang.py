"""`rlgate up --engine sglang`: how real SGLang is started in place of the embedded engine.

The operator's command (RLGATE_SGLANG_COMMAND: a GPU install, or the CPU venv of
scripts/sglang_cpu_venv) on the policy's HF directory, with the flags rlgate needs, then the
operator's extra flags (RLGATE_SGLANG_ARGS). docs/engine.md has both recipes. On CPU
(``--device cpu``) without the operator's own ``--mem-fraction-static``, the fraction is
computed from what the start needs and what is free (rlgate/sglang_memory.py), and printed.
"""

from __future__ import annotations

import shlex

import click

from core.settings import Settings
from rlgate.sglang_memory import with_fraction

# what rlgate needs of SGLang (docs/engine.md): LoRA on every projection the trainer
# adapts, ranks up to the trainer's largest, and the engine key
SGLANG_LORA_FLAGS = (
    "--enable-lora",
    "--max-lora-rank",
    "64",
    "--lora-target-modules",
    "all",
)


def sglang_command(settings: Settings, port: int, key: str) -> list[str]:
    """How ``rlgate up --engine sglang`` starts SGLang: the operator's command
    (RLGATE_SGLANG_COMMAND) on the policy's HF directory, with the flags rlgate needs,
    then the operator's extra flags (RLGATE_SGLANG_ARGS, e.g. the CPU recipe)."""
    from engine.model_files import resolve_model_dir

    model = resolve_model_dir(settings.model_path, settings.data_dir)
    cmd = shlex.split(settings.sglang_command)
    if not cmd:
        raise click.ClickException("RLGATE_SGLANG_COMMAND is empty; set how to start SGLang")
    cmd += ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(port)]
    # one argument, so a random key that starts with "-" is not read as a flag
    extra, memory = with_fraction(model, shlex.split(settings.sglang_args))
    if memory is not None:
        click.echo(f"SGLang on CPU: {memory.reason()}", err=True)
    cmd += [f"--api-key={key}", *SGLANG_LORA_FLAGS, *extra]
    return cmd
