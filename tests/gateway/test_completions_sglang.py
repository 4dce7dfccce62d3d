"""``echo`` with ``logprobs`` on /v1/completions through a gateway on real SGLang (the
session's server, tests/conftest.py ``sglang``): the prompt's logprobs, the first null,
then the completion's; streamed and not. Few tokens: SGLang on CPU is slow."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoTokenizer

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.gateway.fake_engine import in_process_gateway

pytestmark = pytest.mark.timeout(900)

PROMPT = "The capital of France is"


def test_echo_with_logprobs_on_sglang(sglang, sqlite_url, tmp_path, model_dir):  # type: ignore[no-untyped-def]
    upgrade(sqlite_url)
    with transaction(session_factory(make_engine(sqlite_url))) as db:
        _, key = create_key(db, "echo", "agent")
    n = len(AutoTokenizer.from_pretrained(str(model_dir)).encode(PROMPT))
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 1}
    h = {"Authorization": f"Bearer {key}"}
    with in_process_gateway(
        tmp_path / "gw", sqlite_url, sglang.url, engine_api_key=sglang.api_key
    ) as gw:
        r = httpx.post(gw.url + "/v1/completions", headers=h, json=body, timeout=300)
        assert r.status_code == 200, r.text
        s = httpx.post(
            gw.url + "/v1/completions", headers=h, json={**body, "stream": True}, timeout=300
        )
        assert s.status_code == 200, s.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(PROMPT) and "".join(lp["tokens"]) == choice["text"]
    assert len(lp["tokens"]) == n + r.json()["usage"]["completion_tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(alts) in (1, 2) for alts in lp["top_logprobs"][1:])

    events = [ln[6:] for ln in s.text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    head = json.loads(events[0])["choices"][0]
    assert head["text"] == PROMPT and head["logprobs"]["token_logprobs"][0] is None
    streamed = head["logprobs"]["token_logprobs"][1:]
    assert streamed == pytest.approx(lp["token_logprobs"][1:n], abs=1e-3)
