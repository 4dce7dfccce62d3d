"""/v1/completions as frameworks score a prompt, on both engines (the embedded engine and
real SGLang, the session's ``sglang``), each behind its own gateway on SQLite.

``max_tokens: 0`` with ``echo`` (and ``logprobs``) answers the prompt and its logprobs
(the first null), nothing generated, streamed and not; such a call is not recorded
(there is no model turn, nothing to train on). ``frequency_penalty`` and
``presence_penalty`` are taken, as on Chat Completions, and recorded (a penalized sample
is never trained, trainer/data.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.db import make_engine, session_factory
from core.engine_protocol import SGLANG_VERSION
from core.migrate import upgrade
from gateway.call.templating import load_tokenizer
from schemas.tables import InteractionRow
from tests.gateway.conftest import Stack
from tests.gateway.fake_engine import in_process_gateway
from tests.gateway.helpers import wait_recorded

pytestmark = pytest.mark.timeout(600)

PROMPT = "The capital of France is"


@pytest.fixture(scope="module", params=["embedded", f"sglang-{SGLANG_VERSION}"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp(f"scoring-{request.param}")
    db_url = f"sqlite:///{data_dir / 'rlgate.db'}"
    upgrade(db_url)
    settings: dict[str, str] = {}
    if request.param == "embedded":
        engine = request.getfixturevalue("engine")
    else:
        engine = request.getfixturevalue("sglang")
        settings["engine_api_key"] = engine.api_key
    db_engine = make_engine(db_url)
    with in_process_gateway(data_dir, db_url, engine.url, **settings) as proc:
        yield Stack(proc, engine, db_url, session_factory(db_engine), data_dir)
    db_engine.dispose()


def _post(stack: Stack, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        stack.gw.url + "/v1/completions",
        json={"model": "m", **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    )


def _recorded(stack: Stack, ids: list[str]) -> set[str]:
    with stack.factory() as db:  # type: ignore[operator]
        q = select(InteractionRow.id).where(InteractionRow.id.in_(ids))
        return set(db.scalars(q).all())


def test_max_tokens_0_with_echo_scores_the_prompt(gw: Stack, model_dir: Any) -> None:
    key = gw.key()
    n = len(load_tokenizer(model_dir).encode(PROMPT, add_special_tokens=False))
    body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1}
    r = _post(gw, key, body)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == PROMPT and len(lp["tokens"]) == n
    assert lp["token_logprobs"][0] is None
    assert all(x is not None and x <= 0 for x in lp["token_logprobs"][1:])
    assert r.json()["usage"]["completion_tokens"] == 0

    s = _post(gw, key, {**body, "stream": True})
    assert s.status_code == 200, s.text
    events = [ln[6:] for ln in s.text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["text"] for ch in chunks for c in ch["choices"]) == PROMPT
    head = chunks[0]["choices"][0]
    streamed = head["logprobs"]["token_logprobs"]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-3)

    plain = _post(gw, key, {"prompt": PROMPT, "max_tokens": 0})  # no echo: an empty text
    assert plain.status_code == 200, plain.text
    assert plain.json()["choices"][0]["text"] == ""

    after = _post(gw, key, {"prompt": PROMPT, "max_tokens": 2}).json()["id"]
    wait_recorded(gw, [after])  # recorded in order: the scoring calls were not
    scored = [r.json()["id"], chunks[0]["id"], plain.json()["id"]]
    assert _recorded(gw, scored) == set()


def test_penalties_are_taken_and_recorded(gw: Stack) -> None:
    key = gw.key()
    for stream in (False, True):
        body = {
            "prompt": PROMPT,
            "max_tokens": 3,
            "frequency_penalty": 0.5,
            "presence_penalty": -0.25,
            "stream": stream,
        }
        r = _post(gw, key, body)
        assert r.status_code == 200, r.text
        rid = r.json()["id"] if not stream else json.loads(r.text.split("data: ", 2)[1])["id"]
        (rec,) = wait_recorded(gw, [rid])
        assert (rec.frequency_penalty, rec.presence_penalty) == (0.5, -0.25)
    bad = _post(gw, key, {"prompt": PROMPT, "max_tokens": 1, "frequency_penalty": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "frequency_penalty"
