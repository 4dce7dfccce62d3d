"""An engine without the serving adapter (it restarted, or joined) never serves a request
for it with the base model, and is brought to the serving version by the gateway itself.

Two real embedded engines and real gateway processes on SQLite. The project's serving
version is loaded into engine A only, as after engine B restarted, then:
1. the request path (the periodic round set to an hour, so only it acts): calls of many
   sessions, half of which hash to B first, all succeed on the serving version (the
   ``X-Rlgate-Policy-Version`` header and the recorded ``policy_version``); B refuses the
   first one, the gateway fails it over to A and loads the adapter into B, and later
   calls are served by B with it;
2. the periodic round: the adapter is unloaded from B again (a second restart); a
   gateway with a one-second round loads it at its start, and again after one more
   unload, with no request at all;
3. behind a real sglang-router (the PyPI ``sglang-router``, SGLang Model Gateway, in
   front of both engines; RLGATE_ENGINE_ROUTER_URL): the trainer's publish reaches both
   workers through the router's worker list, a session's second turn is served from the
   prefix cache (the router's cache-aware policy), and a worker that lost the adapter is
   brought back to it by the first request it refuses, which then succeeds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.db import transaction
from core.live_adapters import make_live
from core.settings import Settings
from gateway.engines.engine_client import EngineClient
from schemas.tables import InteractionRow, PolicyVersionRow
from tests.engine.conftest import LORA_TARGETS, _make_adapter
from tests.faults.helpers import engine_adapters, setup_db, wait_rows
from tests.servers import engine_cmd, free_port, gateway, running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ENGINE_ARGS = ("--context-length", "1024", "--max-running-requests", "4", "--num-threads", "1")
NAME = "sync-v1"
CALLS = 12


def _load(url: str, path: Path) -> None:
    r = httpx.post(
        f"{url}/load_lora_adapter", json={"lora_name": NAME, "lora_path": str(path)}, timeout=120
    )
    assert r.status_code == 200 and r.json().get("success", True), r.text


def _unload(url: str) -> None:
    r = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": NAME}, timeout=120)
    assert r.status_code == 200, r.text


def _lose(url: str, adapter: Path, tmp: Path) -> None:
    """The engine lost the adapter and cannot re-load it on demand (as after a restart):
    it is loaded once more from a copy, unloaded, and the copy removed, so the path the
    engine remembers for it is gone (an engine re-loads an unloaded adapter from there)."""
    scratch = tmp / f"lost-{url.rsplit(':', 1)[1]}"
    shutil.copytree(adapter, scratch)
    httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": NAME}, timeout=120)
    _load(url, scratch)
    _unload(url)
    shutil.rmtree(scratch)


def _serve(factory: Any, path: Path) -> None:
    make_live(path)  # what the trainer's publish creates: the path engines load it from
    with transaction(factory) as db:
        db.add(
            PolicyVersionRow(
                id="pv-sync-1",
                project_id="faults",
                name=NAME,
                version=1,
                base_model="packaged",
                path=str(path),
                lora_config={},
                status="serving",
            )
        )


def _chat(c: httpx.Client, url: str, key: str, text: str, sid: str) -> httpx.Response:
    return c.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": sid},
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 3},
    )


def _wait(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)
    return time.monotonic() - t0


def _smg() -> str:
    path = str(Path(sys.executable).parent / "smg")  # the venv's, then the PATH's
    path = path if Path(path).exists() else shutil.which("smg") or ""
    if not path:
        pytest.fail("sglang-router is not installed (pip install -e '.[dev]')")
    return path


def test_engine_without_the_adapter_is_caught_up(sqlite_url, tmp_path, model_dir) -> None:
    factory, (key,) = setup_db(sqlite_url)
    adapter = _make_adapter(model_dir, tmp_path / "adapters" / NAME, 4, 7, LORA_TARGETS)
    pa, pb = free_port(), free_port()
    with (
        running(engine_cmd(pa, *ENGINE_ARGS), {}, tmp_path / "a.log", pa) as a,
        running(engine_cmd(pb, *ENGINE_ARGS), {}, tmp_path / "b.log", pb) as b,
    ):
        urls = f"{a.url},{b.url}"
        # 1. the request path alone
        with gateway(tmp_path / "gw1", sqlite_url, urls, engine_sync_s="3600") as gw:
            _load(a.url, adapter)  # engine B "restarted": it lacks the serving version
            _serve(factory, adapter)
            time.sleep(0.6)  # the gateway's serving-pointer cache
            ids = []
            with httpx.Client(timeout=120) as c:
                for i in range(CALLS):
                    r = _chat(c, gw.url, key, f"Say {i}.", f"sync-{i}")
                    assert r.status_code == 200, r.text
                    assert r.headers["x-rlgate-policy-version"] == NAME
                    ids.append(r.json()["id"])
            wait_rows(factory, set(ids), timeout=60)
            with factory() as db:
                found = db.scalars(select(InteractionRow).where(InteractionRow.id.in_(ids)))
                rows = {r.id: r for r in found}
            assert {r.policy_version for r in rows.values()} == {NAME}
            assert NAME in engine_adapters(b.url)  # loaded by the gateway, not by a trainer
            ring = EngineClient([a.url, b.url])
            prefers_b = [ring._order(rows[i].session_id)[0].url == b.url for i in ids]
            served = [rows[i].engine_url for i in ids]
            first_b = prefers_b.index(True)
            # the first call that hashed to B went to A while B lacked the adapter ...
            assert served[first_b] == a.url, (prefers_b, served)
            # ... and once the gateway had loaded it, B served the calls that hash to it
            assert served[prefers_b.index(True, first_b + 1)] == b.url, (prefers_b, served)
        # 2. the periodic round, with no request: at the gateway's start, then again
        _unload(b.url)
        with gateway(tmp_path / "gw2", sqlite_url, urls, engine_sync_s="1"):
            _wait(lambda: NAME in engine_adapters(b.url), 30, "the gateway's first round")
            _unload(b.url)
            caught_up_s = _wait(lambda: NAME in engine_adapters(b.url), 30, "periodic reload")
        # 3. behind a real sglang-router
        _unload(b.url)
        assert NAME in engine_adapters(a.url) and NAME not in engine_adapters(b.url)
        pr = free_port()
        log = tmp_path / "router.log"
        router_cmd = [_smg(), "launch", "--host", "127.0.0.1", "--port", str(pr)]
        router_cmd += ["--policy", "cache_aware", "--worker-urls", a.url, b.url]
        router_cmd += ["--log-level", "warn", "--prometheus-port", str(free_port())]
        with log.open("ab") as fh:
            router = subprocess.Popen(router_cmd, stdout=fh, stderr=subprocess.STDOUT)
        try:
            router_url = f"http://127.0.0.1:{pr}"
            _wait(lambda: _router_up(router_url), 60, "the router lists both workers")
            from trainer import publish

            settings = Settings(
                engine_router_url=router_url,
                engine_router_workers=f"{a.url},{b.url}",
                engine_urls="http://unused:1",
            )
            assert sorted(publish.engines(settings)) == sorted([a.url, b.url])
            publish.load_everywhere(publish.engines(settings), NAME, str(adapter), {})
            assert NAME in engine_adapters(b.url)  # the publish reached the worker through the list
            _unload(b.url)  # ... B loses it again, and the gateway's first round reloads it
            with (
                gateway(
                    tmp_path / "gw3",
                    sqlite_url,
                    "http://unused:1",
                    engine_router_url=router_url,
                    engine_router_workers=f"{a.url},{b.url}",
                    engine_sync_s="3600",
                ) as gw,
                httpx.Client(timeout=120) as c,
            ):
                _wait(lambda: NAME in engine_adapters(b.url), 30, "the gateway's first round")
                # both workers lose it (the router picks one we cannot choose): the first
                # refused request loads it into both, then goes through the router again
                _lose(a.url, adapter, tmp_path)
                _lose(b.url, adapter, tmp_path)
                turns = []
                for i in range(CALLS):
                    r = _chat(c, gw.url, key, f"Count to {i}.", f"routed-{i}")
                    assert r.status_code == 200, r.text
                    assert r.headers["x-rlgate-policy-version"] == NAME
                assert NAME in engine_adapters(a.url) and NAME in engine_adapters(b.url)
                msgs = [{"role": "user", "content": "Describe a cat in one sentence."}]
                body: dict[str, Any] = {"messages": msgs, "max_tokens": 8, "temperature": 0}
                hdr = {"Authorization": f"Bearer {key}", "X-Session-Id": "routed-turns"}
                r1 = c.post(f"{gw.url}/v1/chat/completions", headers=hdr, json=body)
                msgs += [
                    {"role": "assistant", "content": r1.json()["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "And a dog?"},
                ]
                r2 = c.post(f"{gw.url}/v1/chat/completions", headers=hdr, json=body)
                assert r2.status_code == 200, r2.text
                cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                turns.append(cached)
                assert cached > 0, r2.json()["usage"]
        finally:
            router.terminate()
            router.wait(timeout=30)
    with factory() as db:
        routed = db.scalars(
            select(InteractionRow.policy_version).where(InteractionRow.session_id.is_not(None))
        ).all()
    assert set(routed) == {NAME}
    print(
        f"\nadapter sync: {CALLS} calls with engine B lacking the serving adapter: all 200 on "
        f"{NAME}, the first hashed to B failed over to A, the next hashed to B was served "
        f"by B; periodic round reloaded B in {caught_up_s:.1f} s; behind "
        f"sglang-router: {CALLS} calls all 200 on {NAME} after both workers lost it, both "
        f"reloaded; turn 2 had "
        f"{turns[0]} cached prompt tokens"
    )


def _router_up(url: str) -> bool:
    try:
        workers = httpx.get(f"{url}/workers", timeout=2).json().get("workers", [])
    except (httpx.HTTPError, ValueError):
        return False
    return len(workers) == 2 and all(w.get("is_healthy") for w in workers)
