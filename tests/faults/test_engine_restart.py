"""The engine stopped under load: each API answers a clean 503 in its own error format
(OpenAI chat, Anthropic messages, Responses; streaming and not), nothing is recorded for
the failed calls, and once an engine is back on the same port the same gateway process
serves again (no gateway restart)."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.faults.helpers import call_shapes, post, rows, setup_db, wait_rows
from tests.servers import engine_cmd, free_port, gateway, running

pytestmark = pytest.mark.timeout(600)

ENGINE_ARGS = ("--context-length", "1024", "--max-running-requests", "4")


def _is_clean_503(api: str, r: httpx.Response) -> bool:
    if r.status_code != 503:
        return False
    body = r.json()
    if api == "anthropic":
        return body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    return body["error"]["type"] == "service_unavailable" and bool(body["error"]["message"])


def test_engine_down_503s_per_api_then_recovery_without_gateway_restart(
    sqlite_url, tmp_path, model_dir
):
    factory, (key,) = setup_db(sqlite_url)
    port = free_port()
    eng_log = tmp_path / "engine.log"
    with (
        running(engine_cmd(port, *ENGINE_ARGS), {}, eng_log, port) as eng,
        gateway(tmp_path / "gw", sqlite_url, eng.url) as gw,
    ):
        warm = set()
        with httpx.Client(timeout=120) as c:
            for api, (path, body) in call_shapes("Say hi.", False).items():
                r = post(c, gw.url, key, path, body)
                assert r.status_code == 200, (api, r.text)
                warm.add(r.json()["id"])
        # recording is asynchronous: count once the three answers are in the database
        before = len(wait_rows(factory, warm, timeout=60))
        assert before == 3
        eng.kill(signal.SIGKILL)

        # load while the engine is down: every call of every shape is a clean 503
        def hammer(i: int) -> list[tuple[str, bool, int, bool]]:
            out = []
            with httpx.Client(timeout=60) as c:
                for stream in (False, True):
                    for api, (path, body) in call_shapes(f"hi {i}", stream).items():
                        r = post(c, gw.url, key, path, body)
                        out.append((api, stream, r.status_code, _is_clean_503(api, r)))
            return out

        with ThreadPoolExecutor(4) as pool:
            results = [x for xs in pool.map(hammer, range(8)) for x in xs]
        bad = [x for x in results if not x[3]]
        print(f"engine down: {sum(x[3] for x in results)} of {len(results)} calls a clean 503")
        assert not bad, bad
        assert len(results) == 8 * 2 * 3
        assert gw.proc.poll() is None
        assert len(rows(factory)) == before  # nothing recorded for failed calls
        health = httpx.get(gw.url + "/health", timeout=10)
        assert health.status_code == 503

        # the engine comes back on the same port; the same gateway serves again
        with running(engine_cmd(port, *ENGINE_ARGS), {}, eng_log, port):
            deadline = time.monotonic() + 60
            with httpx.Client(timeout=120) as c:
                while True:
                    path, body = call_shapes("Say hi.", False)["openai-chat"]
                    r = post(c, gw.url, key, path, body)
                    if r.status_code == 200 or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                assert r.status_code == 200, r.text
                print("engine back on the same port: the same gateway serves again")
                for stream in (False, True):
                    for api, (path, body) in call_shapes("Again.", stream).items():
                        r = post(c, gw.url, key, path, body)
                        assert r.status_code == 200, (api, stream, r.text)
            assert gw.proc.poll() is None
