"""Work a request's content drives is bounded and off the event loop (issue 36, findings
1 and 5): a Responses custom tool's regex or Lark grammar is read on the render pool;
a forced tool's is converted there, within a budget (core/ebnf_budget.py). A nesting
bomb or a deep nest is a 400 in OpenAI's format naming ``tools[0].format.definition``
and the limit, never a 500, and another client's ``/health`` is answered while such
requests are handled. An offered (not forced) tool's grammar is read, not converted.

The fast in-process tier (tests/gateway/fake_engine.py): the real gateway app and
tokenizer in front of a fake engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import gateway.call.pipeline
from tests.gateway.fake_engine import FastStack, fast_stack
from tests.grammar_bombs import BOMBS
from tests.grammar_bombs import custom_tool_body as _body

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def fast(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastStack]:
    with fast_stack(tmp_path_factory.mktemp("budgets"), model_dir) as stack:
        yield stack


def _while_health(fast: FastStack, send: Any, n: int = 4) -> tuple[list[Any], list[float]]:
    """``n`` calls of ``send()`` at once, and ``/health`` asked again and again until they
    have all returned: (their answers, every /health latency in seconds)."""
    latencies: list[float] = []
    with ThreadPoolExecutor(n) as pool, httpx.Client(timeout=60) as client:
        futures = [pool.submit(send) for _ in range(n)]
        while True:
            t = time.monotonic()
            assert client.get(fast.url + "/health").status_code == 200
            latencies.append(time.monotonic() - t)
            if all(f.done() for f in futures) and len(latencies) >= 3:
                break
        return [f.result() for f in futures], latencies


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_forced_bomb_or_deep_nest_is_400_and_health_stays_fast(
    fast: FastStack, name: str
) -> None:
    syntax, definition, limit = BOMBS[name]
    body = _body(syntax, definition, forced=True)
    answers, latencies = _while_health(fast, lambda: fast.post("/v1/responses", body))
    for r in answers:
        assert r.status_code == 400, r.text[:500]
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error"
        assert err["param"] == "tools[0].format.definition"
        assert err["param"] in err["message"] and limit in err["message"], err["message"]
    # generous: the probe of issue 36 took 12 s; an idle /health takes milliseconds
    assert max(latencies) < 2.0, latencies


@pytest.mark.parametrize("name", ["regex-bomb", "lark-bomb"])
def test_an_offered_bomb_is_only_read(fast: FastStack, name: str) -> None:
    """Only a forced call needs the EBNF: an offered tool's grammar is read and checked
    (syntax, depth), never copied out, so the call is answered."""
    syntax, definition, _ = BOMBS[name]
    body = _body(syntax, definition, forced=False)
    answers, latencies = _while_health(fast, lambda: fast.post("/v1/responses", body))
    assert [r.status_code for r in answers] == [200] * len(answers), answers[0].text[:500]
    assert max(latencies) < 2.0, latencies


@pytest.mark.parametrize("name", ["regex-depth-400", "lark-depth-5000"])
def test_an_offered_deep_nest_is_400(fast: FastStack, name: str) -> None:
    syntax, definition, limit = BOMBS[name]
    r = fast.post("/v1/responses", _body(syntax, definition, forced=False))
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == "tools[0].format.definition" and limit in err["message"]


def test_grammars_are_read_on_the_render_pool(
    fast: FastStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools' grammars are read and converted on the render pool's threads, never on
    the event loop's."""
    threads: list[str] = []
    real = gateway.call.pipeline.tool_grammar

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(gateway.call.pipeline, "tool_grammar", spy)
    r = fast.post("/v1/responses", _body("regex", "[a-z]{1,8}", forced=True))
    assert r.status_code == 200, r.text[:500]
    assert len(threads) == 1 and threads[0].startswith("rlgate-render"), threads
    forced = fast.engine.arrivals[-1]["sampling_params"]["structural_tag"]
    assert "[a-z]" in forced  # the converted grammar reached the engine
