"""One log format for the gateway and the worker processes, at RLGATE_LOG_LEVEL (the
embedded engine, which does not import core, sets its own in engine/server.py)."""

from __future__ import annotations

import logging
import sys


def configure(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
