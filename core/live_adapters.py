"""The path an engine loads a policy version from, which exists only while it may serve.

SGLang re-loads an unloaded adapter on demand, from the path it was loaded from, when a
request names it (``TokenizerManager._resolve_lora_path``; the embedded engine does the
same). An unload alone therefore does not take a version out of service: a gateway whose
serving cache still names it would bring it back. So no engine is ever given a version's
own directory (``<adapter dir>/<project>/<name>``, kept for rollback and for training
from a parent). The trainer links its files into a *live* directory,
``<adapter dir>/<project>/live/<name>``, before loading it, and removes that directory
before unloading: from then on the engine cannot re-load it, and a request naming it is
refused (400; the gateway re-reads the serving version and retries on it).

Only the trainer creates or removes live directories (``make_live``/``drop_live``); a
gateway's adapter sync loads serving versions from ``live_path`` and never creates one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

LIVE = "live"
# what an engine reads of a PEFT directory
ENGINE_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def live_path(path: str | Path) -> Path:
    """Where the version stored at ``path`` is loaded from: ``<its parent>/live/<name>``."""
    p = Path(path)
    return p.parent / LIVE / p.name


def make_live(path: str | Path) -> Path:
    """Create (or keep) the live directory of the version stored at ``path``: hard links
    to its engine files (a copy where links are not possible), written under a temporary
    name and renamed into place. Returns the live path."""
    src = Path(path)
    dst = live_path(src)
    if dst.is_dir():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{src.name}.", dir=dst.parent))
    try:
        found = False
        for name in ENGINE_FILES:
            if not (src / name).is_file():
                continue
            found = True
            try:
                os.link(src / name, tmp / name)
            except OSError:
                shutil.copy2(src / name, tmp / name)
        if not found:
            raise FileNotFoundError(f"{src} holds no adapter files ({', '.join(ENGINE_FILES)})")
        try:
            tmp.rename(dst)
        except OSError:
            if not dst.is_dir():  # not a concurrent make_live of the same version
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def drop_live(path: str | Path) -> None:
    """Remove the live directory of the version stored at ``path`` (if any): renamed away
    first, so an engine reading it finds it whole or not at all."""
    dst = live_path(path)
    if not dst.exists():
        return
    gone = dst.parent / f".gone-{dst.name}-{os.getpid()}"
    try:
        dst.rename(gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)
