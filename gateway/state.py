"""The running gateway's state: what ``request.app.state.gw`` holds for every route.

Built by gateway/app.py (``build_gateway``); the route modules read it through
gateway.routes.request_context.gw_of and depend on this module, never on gateway/app.py,
which imports them (tests/test_imports.py: no import cycles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.settings import Settings
from gateway.call.pipeline import Pipeline
from gateway.edge.auth import Authenticator
from gateway.edge.metrics import Metrics
from gateway.engines.adapter_sync import AdapterSync
from gateway.engines.engine_client import EngineClient
from gateway.engines.unloads import Unloads
from gateway.recording.next_turn import NextTurnDispatch
from gateway.recording.recorder import Recorder


@dataclass
class Gateway:
    settings: Settings
    factory: sessionmaker[Session]
    auth: Authenticator
    pipeline: Pipeline
    recorder: Recorder
    engines: EngineClient
    metrics: Metrics
    tokenizer: Any
    adapter_sync: AdapterSync
    next_turn: NextTurnDispatch | None = None  # queues the next-turn task after a commit
    unloads: Unloads | None = None  # background unloads of replaced versions
