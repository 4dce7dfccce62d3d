"""One GPU for serving and training: the engines named in RLGATE_TRAIN_SHARED_GPU_ENGINES
give their GPU memory up while a run trains (docs/engine.md, "One GPU shared with
training").

Around the fit (trainer/runner.py): each engine is paused (``/pause_generation``, mode
``retract``: running requests go back to its queue, new ones wait there) and releases
its weights, KV cache and CUDA graphs (``/release_memory_occupation``, SGLang started
with ``--enable-memory-saver``); after the fit, failed or not, each takes its memory
back (``/resume_memory_occupation``) and continues (``/continue_generation``): then the
run publishes, which loads the adapter into the engine and may generate (the eval gate).
An engine that refuses to release fails the run before the base is loaded (the engines
released before it are resumed); one that cannot resume is logged and raised, and the run
fails with it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from core.engine_http import EngineHTTP, control_urls
from core.settings import Settings

log = logging.getLogger("rlgate.trainer")

TIMEOUT_S = 300.0  # releasing waits for the running requests to be retracted


class SharedGPUError(RuntimeError):
    """An engine sharing the GPU could not release or resume its memory."""


@contextlib.contextmanager
def engines_released(settings: Settings) -> Iterator[list[str]]:
    """Release the GPU memory of the engines that share it with training, for the body."""
    urls = settings.train_shared_gpu_engine_list
    if not urls:
        yield []
        return
    known = set(control_urls(settings))
    strangers = [u for u in urls if u not in known]
    if strangers:
        raise SharedGPUError(
            f"RLGATE_TRAIN_SHARED_GPU_ENGINES names {strangers}, which are not among the "
            f"engines adapters are loaded into ({sorted(known)})"
        )
    released: list[str] = []
    try:
        for url in urls:
            started = time.monotonic()
            try:
                with EngineHTTP(url, settings.engine_headers, TIMEOUT_S) as engine:
                    engine.release_memory()
            except Exception as e:
                raise SharedGPUError(
                    f"engine {url} did not release its GPU memory ({type(e).__name__}: {e}); "
                    "SGLang needs --enable-memory-saver (docs/engine.md)"
                ) from e
            released.append(url)
            log.info("engine %s released its GPU memory (%.1f s)", url, time.monotonic() - started)
        yield released
    finally:
        _resume(settings, released)


def _resume(settings: Settings, urls: list[str]) -> None:
    failed = []
    for url in urls:
        started = time.monotonic()
        try:
            with EngineHTTP(url, settings.engine_headers, TIMEOUT_S) as engine:
                engine.resume_memory()
            log.info("engine %s resumed its GPU memory (%.1f s)", url, time.monotonic() - started)
        except Exception as e:  # the others still get theirs back
            log.error("engine %s did not resume its GPU memory: %s", url, e)
            failed.append(f"{url}: {type(e).__name__}: {e}")
    if failed:
        raise SharedGPUError(f"engines did not resume their GPU memory: {failed}")
