"""Small helpers shared by the fault tests: keys, three API call shapes, row reads."""

from __future__ import annotations

import time
from typing import Any

import httpx
from sqlalchemy import select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.tables import InteractionRow


def setup_db(db_url: str, n_keys: int = 1, project: str = "faults") -> tuple[Any, list[str]]:
    """Migrate, then create ``n_keys`` agent keys; returns (session factory, secrets)."""
    upgrade(db_url)
    factory = session_factory(make_engine(db_url))
    secrets = []
    with transaction(factory) as db:
        for _ in range(n_keys):
            secrets.append(create_key(db, project, "agent")[1])
    return factory, secrets


# (path, body) per client API: OpenAI chat, Anthropic messages, OpenAI Responses
def call_shapes(text: str, stream: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "openai-chat": (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": text}], "max_tokens": 3, "stream": stream},
        ),
        "anthropic": (
            "/v1/messages",
            {
                "model": "rlgate-policy",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": text}],
                "stream": stream,
            },
        ),
        "responses": (
            "/v1/responses",
            {"model": "rlgate-policy", "input": text, "max_output_tokens": 3, "stream": stream},
        ),
    }


def rows(factory: Any) -> list[Any]:
    with factory() as db:
        return list(
            db.execute(
                select(InteractionRow.id, InteractionRow.session_id, InteractionRow.seq)
            ).all()
        )


def wait_rows(factory: Any, ids: set[str], timeout: float) -> list[Any]:
    """All interaction rows once ``ids`` are all among them (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        found = rows(factory)
        if ids <= {r.id for r in found} or time.monotonic() > deadline:
            return found
        time.sleep(0.3)


def post(client: httpx.Client, url: str, key: str, path: str, body: dict[str, Any]) -> Any:
    return client.post(url + path, json=body, headers={"Authorization": f"Bearer {key}"})


def engine_adapters(url: str, headers: dict[str, str] | None = None) -> set[str]:
    """The adapters an engine holds (its ``/v1/models`` entries with a parent)."""
    data = httpx.get(f"{url}/v1/models", headers=headers or {}, timeout=30).json()["data"]
    return {m["id"] for m in data if m.get("parent")}
