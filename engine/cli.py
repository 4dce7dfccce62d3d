"""``rlgate engine``: serve the embedded engine (registered by rlgate/cli.py)."""

from __future__ import annotations

from pathlib import Path

import click

from engine.projections import PROJECTIONS as DEFAULT_TARGET_MODULES


def _split_modules(value: str) -> tuple[str, ...]:
    modules = tuple(m for m in value.replace(",", " ").split() if m)
    if modules in (("all",), ("all-linear",)):
        return DEFAULT_TARGET_MODULES
    unknown = set(modules) - set(DEFAULT_TARGET_MODULES)
    if unknown or not modules:
        raise click.BadParameter(
            f"choose from {', '.join(DEFAULT_TARGET_MODULES)} or 'all'",
            param_hint="--lora-target-modules",
        )
    return modules


def _parse_lora_paths(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = Path(value).name, value
        out[name] = path
    return out


@click.command("engine")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address.")
@click.option("--port", type=int, default=None, help="Port (default: settings engine_port).")
@click.option(
    "--model",
    "model_path",
    default=None,
    help="HF model directory, or packaged:smollm2-135m-instruct (default: settings).",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the converted packaged model is cached (default: settings).",
)
@click.option(
    "--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True
)
@click.option(
    "--weights",
    type=click.Choice(["float", "int4"]),
    default=None,
    help="int4 (default: settings engine_weights, int4): keep each projection whose "
    "weights lie on a 4-bit grid of 32-weight blocks (a Q4_0 / Q4_1 GGUF's, as the "
    "packaged model's) packed, multiplied by PyTorch's int4 CPU kernel: about 3x faster "
    "decoding at one stream, about a sixth of the projections' memory; their inputs and "
    "outputs are rounded to bfloat16, which moves logprobs by about 0.01 and makes results "
    "depend on the batch (docs/engine.md, Weights). Projections not on such a grid stay "
    "--dtype. float: every weight in --dtype, exact to transformers within 1e-4.",
)
@click.option("--max-lora-rank", type=int, default=64, show_default=True)
@click.option(
    "--lora-target-modules",
    default=",".join(DEFAULT_TARGET_MODULES),
    show_default=True,
    help="Comma-separated projections adapters may target, or 'all'.",
)
@click.option("--max-loaded-loras", type=int, default=8, show_default=True)
@click.option(
    "--max-running-requests",
    type=int,
    default=16,
    show_default=True,
    help="KV slots: sequences decoded together in one batch.",
)
@click.option(
    "--context-length",
    type=int,
    default=None,
    help="Per-sequence token limit (default: min(model's, 4096)).",
)
@click.option(
    "--max-memory-gb",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Refuse to start unless the worst case fits in this many GB: the weights, the KV "
    "cache of every slot at the full context, and --max-loaded-loras adapters at "
    "--max-lora-rank (engine/memory.py; the message says what fits). Default: no bound.",
)
@click.option("--served-model-name", default=None, help="Name in /v1/models (default: --model).")
@click.option("--lora-paths", multiple=True, help="NAME=PATH adapters to load at start.")
@click.option("--num-threads", type=int, default=None, help="Torch threads (default: all cores).")
@click.option(
    "--disable-prefix-reuse",
    is_flag=True,
    help="Prefill every prompt in full instead of copying a prefix that a running or "
    "recently finished sequence already holds (for benchmarks).",
)
@click.option(
    "--prefix-cache-slots",
    type=int,
    default=4,
    show_default=True,
    help="Extra KV slots that keep finished sequences, so a later prompt extending one (a "
    "conversation's next turn) copies it instead of prefilling it again.",
)
@click.option(
    "--api-key",
    default=None,
    help="Require 'Authorization: Bearer <key>' on every route but /health* (as SGLang's "
    "--api-key); unauthenticated requests get 401. Default: settings engine_api_key "
    "(RLGATE_ENGINE_API_KEY); unset leaves the engine open, for loopback use only.",
)
@click.option(
    "--allowed-lora-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Load adapters (/load_lora_adapter, --lora-paths) only from under this directory "
    "(symlinks resolved). Default: any path the engine can read.",
)
@click.option("--log-level", default=None, help="Default: settings log_level.")
def engine_command(
    host: str,
    port: int | None,
    model_path: str | None,
    data_dir: Path | None,
    dtype: str,
    weights: str | None,
    max_lora_rank: int,
    lora_target_modules: str,
    max_loaded_loras: int,
    max_running_requests: int,
    context_length: int | None,
    max_memory_gb: float | None,
    served_model_name: str | None,
    lora_paths: tuple[str, ...],
    num_threads: int | None,
    disable_prefix_reuse: bool,
    prefix_cache_slots: int,
    api_key: str | None,
    allowed_lora_dir: Path | None,
    log_level: str | None,
) -> None:
    """Serve the embedded CPU engine (SGLang native protocol subset)."""
    from core.settings import get_settings
    from engine.memory import MemoryBoundError
    from engine.server import EngineConfig, serve

    settings = get_settings()
    for name, value in (
        ("--max-lora-rank", max_lora_rank),
        ("--max-loaded-loras", max_loaded_loras),
        ("--max-running-requests", max_running_requests),
    ):
        if value < 1:
            raise click.BadParameter("must be >= 1", param_hint=name)
    if prefix_cache_slots < 0:
        raise click.BadParameter("must be >= 0", param_hint="--prefix-cache-slots")
    api_key = api_key or settings.engine_api_key_value
    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(
            f"warning: the engine listens on {host} without --api-key: anyone who reaches "
            "the port can generate, load adapters and abort requests",
            err=True,
        )
    try:
        serve(
            EngineConfig(
                model_path=model_path or settings.model_path,
                data_dir=data_dir or settings.data_dir,
                host=host,
                port=port or settings.engine_port,
                dtype=dtype,
                weights=weights or settings.engine_weights,
                max_lora_rank=max_lora_rank,
                lora_target_modules=_split_modules(lora_target_modules),
                max_loaded_loras=max_loaded_loras,
                max_running_requests=max_running_requests,
                context_length=context_length,
                served_model_name=served_model_name,
                log_level=log_level or settings.log_level,
                num_threads=num_threads,
                lora_paths=_parse_lora_paths(lora_paths),
                prefix_reuse=not disable_prefix_reuse,
                prefix_cache_slots=prefix_cache_slots,
                api_key=api_key,
                allowed_lora_dir=allowed_lora_dir,
                max_memory_gb=max_memory_gb,
            )
        )
    except MemoryBoundError as e:
        raise click.ClickException(str(e)) from None
