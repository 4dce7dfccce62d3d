"""Dashboard fixtures: the gateway app served from this process (tests/gateway/fake_engine.py
in_process_gateway, the settings a gateway process reads) on a seeded SQLite database, and
headless Chromium (Debian's /usr/bin/chromium) driven by Playwright.

The model engine is a small HTTP stub that speaks SGLang's documented adapter protocol
(``/load_lora_adapter``, ``/unload_lora_adapter``, ``/health``, ``/v1/models``): the
dashboard only publishes adapters through it, and loading the real model would only
slow these tests down. It records every call so tests can check what was published.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.tables import (
    FeedbackRow,
    InteractionRow,
    PolicyVersionRow,
    ProjectRow,
    SessionRow,
    TrainingRunRow,
)
from tests.gateway.fake_engine import in_process_gateway
from tests.servers import REPO, free_port

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = os.environ.get("RLGATE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BOOTSTRAP_KEY = "rlg_admin_bootstrap_" + secrets.token_urlsafe(16)
BIG_SESSIONS = 10_000


@dataclass
class StubEngine:
    url: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    loaded: set[str] = field(default_factory=set)


def _stub_engine() -> tuple[StubEngine, ThreadingHTTPServer]:
    port = free_port()
    stub = StubEngine(f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: dict[str, Any], status: int = 200) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send({})
            elif self.path == "/v1/models":
                ids = ["base", *sorted(stub.loaded)]
                self._send({"object": "list", "data": [{"id": i} for i in ids]})
            else:
                self._send({"error": "not found"}, 404)

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            stub.calls.append((self.path, body))
            if self.path == "/load_lora_adapter":
                stub.loaded.add(body["lora_name"])
            elif self.path == "/unload_lora_adapter":
                stub.loaded.discard(body["lora_name"])
            else:
                self._send({"error": "not found"}, 404)
                return
            self._send(
                {
                    "success": True,
                    "error_message": "",
                    "loaded_adapters": {k: k for k in stub.loaded},
                }
            )

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return stub, server


@dataclass
class Dash:
    url: str
    factory: Any
    engine: StubEngine
    admin_key: str  # a project admin key of p1
    agent_key: str
    bootstrap_key: str
    finished_run: str
    failed_run: str
    session_id: str


def seed(factory: Any, adapters: Path) -> dict[str, str]:
    now = utcnow()
    out: dict[str, str] = {}
    with transaction(factory) as db:
        db.add(ProjectRow(id="p1", name="Demo project", created_at=now))
        db.add(ProjectRow(id="big", name="Ten thousand sessions", created_at=now))
        db.flush()
        _, out["admin"] = create_key(db, "p1", "admin", name="dashboard test")
        _, out["agent"] = create_key(db, "p1", "agent", name="agent test")
        # adapters: v1 retired, v2 serving, v3 candidate (files on disk: a promote makes
        # their live directory, core/live_adapters.py)
        for v, status in ((1, "retired"), (2, "serving"), (3, "candidate")):
            stored = adapters / "p1" / f"p1-policy-v{v}"
            stored.mkdir(parents=True, exist_ok=True)
            (stored / "adapter_config.json").write_text("{}")
            (stored / "adapter_model.safetensors").write_bytes(b"")
            db.add(
                PolicyVersionRow(
                    id=f"pv_{v}",
                    project_id="p1",
                    name=f"p1-policy-v{v}",
                    version=v,
                    parent_name=f"p1-policy-v{v - 1}" if v > 1 else None,
                    base_model="SmolLM2-135M-Instruct",
                    path=str(stored),
                    lora_config={"r": 8, "alpha": 16},
                    created_by_run_id=f"run_{v}",
                    status=status,
                    eval_metrics={"eval_new": 0.5 + v / 10, "eval_serving": 0.5, "eval_margin": 0},
                    created_at=now - timedelta(hours=4 - v),
                    promoted_at=now - timedelta(hours=4 - v) if status != "candidate" else None,
                )
            )
        steps = [
            {
                "step": i,
                "loss": 1.0 / (i + 1),
                "reward_mean": -0.5 + i * 0.1,
                "kl": 0.001 * i,
                "clip_frac": 0.02 * (i % 3),
                "masked_frac": 0.1,
                "tokens_per_s": 900 + 20 * i,
            }
            for i in range(12)
        ]
        for v in (1, 2, 3):
            db.add(
                TrainingRunRow(
                    id=f"run_{v}",
                    project_id="p1",
                    trigger="schedule" if v < 3 else "threshold",
                    status="published" if v < 3 else "trained-not-published",
                    config={"lr": 1e-4, "lora_r": 8, "steps": 12},
                    num_samples=2,
                    step_metrics=steps,
                    policy_version_id=f"pv_{v}",
                    created_at=now - timedelta(hours=4 - v, minutes=5),
                    started_at=now - timedelta(hours=4 - v, minutes=5),
                    finished_at=now - timedelta(hours=4 - v),
                )
            )
        db.add(
            TrainingRunRow(
                id="run_failed",
                project_id="p1",
                trigger="manual",
                status="failed",
                config={"lr": 1e-4},
                num_samples=0,
                step_metrics=[],
                error="RuntimeError: CUDA out of memory (test)",
                created_at=now - timedelta(minutes=30),
                started_at=now - timedelta(minutes=30),
                finished_at=now - timedelta(minutes=29),
            )
        )
        # one session with a tool-using trajectory
        sid = "sess_demo"
        db.add(
            SessionRow(
                id=sid,
                project_id="p1",
                agent_name="hermes",
                task_id="weather-1",
                client_protocol="openai-chat",
                status="closed",
                created_at=now,
                last_activity_at=now,
                meta={"ticket": 42},
            )
        )
        db.flush()
        m1 = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ]
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        m2 = [
            *m1,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
        ]
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        turns = [
            (
                m1,
                [3, 5, 7, 9],
                [-0.01, -0.3, -2.5, -0.05],
                None,
                {
                    "text": None,
                    "reasoning": "I should call the tool.",
                    "tool_calls": [
                        {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
                    ],
                },
                0.5,
            ),
            (
                m2,
                [40, 41, 42, 43, 44],
                [-0.001, -0.7, -0.02, -4.0, -0.1],
                "int_0",
                {"text": "It is 18 °C in Paris.", "reasoning": None, "tool_calls": []},
                1.0,
            ),
        ]
        for i, (msgs, ids, lps, parent, output, reward) in enumerate(turns):
            db.add(
                InteractionRow(
                    id=f"int_{i}",
                    project_id="p1",
                    session_id=sid,
                    seq=i,
                    parent_id=parent,
                    request={"model": "rlgate", "messages": msgs, "tools": tools},
                    prompt_token_ids=[1, 2, 3],
                    completion_token_ids=ids,
                    completion_logprobs=lps,
                    temperature=0.7,
                    top_p=1.0,
                    policy_version=f"p1-policy-v{i + 1}",
                    finish_reason="stop",
                    output=output,
                    usage={"prompt_tokens": 3, "completion_tokens": len(ids)},
                    latency_ms=120.0,
                    created_at=now - timedelta(minutes=2 - i),
                    reward=reward,
                    consumed_by_run_id="run_2" if i == 0 else None,
                )
            )
        db.add(
            FeedbackRow(
                id="fb_1",
                project_id="p1",
                target_type="session",
                target_id=sid,
                session_id=sid,
                value=1,
                scale="binary",
                reward=1.0,
                source="user",
                rater="alice",
                comment="good answer",
                created_at=now,
            )
        )
        out["session"] = sid
    # 10,000 sessions in project "big", one bulk insert
    base = utcnow()
    rows = [
        {
            "id": f"sess_big_{i:05d}",
            "project_id": "big",
            "agent_name": "bulk-agent" if i % 2 else "other-agent",
            "status": "open" if i % 3 else "closed",
            "created_at": base - timedelta(seconds=i),
            "last_activity_at": base - timedelta(seconds=i),
            "metadata": {},
        }
        for i in range(BIG_SESSIONS)
    ]
    with factory.begin() as db:
        db.execute(insert(SessionRow), rows)
    return out


@pytest.fixture(scope="module")  # an in-process gateway's settings hold while it serves
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    data_dir = tmp_path_factory.mktemp("admin-dash")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    engine = make_engine(db_url)
    factory = session_factory(engine)
    keys = seed(factory, data_dir / "adapters")
    stub, server = _stub_engine()
    try:
        with in_process_gateway(data_dir, db_url, stub.url, admin_key=BOOTSTRAP_KEY) as gw:
            yield Dash(
                gw.url,
                factory,
                stub,
                keys["admin"],
                keys["agent"],
                BOOTSTRAP_KEY,
                "run_2",
                "run_failed",
                keys["session"],
            )
    finally:
        server.shutdown()
        engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread
    while it is open, which would break later tests that call asyncio.run()."""
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, dash: Dash) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1366, "height": 900})
    ctx.set_default_timeout(120_000)  # the first train-now imports the trainer (torch)
    p = ctx.new_page()
    yield p
    ctx.close()


def login(page: Any, dash: Dash, key: str | None = None) -> None:
    page.goto(dash.url + "/admin/login")
    page.fill("input[name=key]", key or dash.admin_key)
    page.click("button[type=submit]")
    page.wait_for_url(dash.url + "/admin")


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"admin-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
