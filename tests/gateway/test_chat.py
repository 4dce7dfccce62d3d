"""OpenAI Chat Completions through the gateway with the official openai SDK.

Runs against the real embedded engine (packaged SmolLM2-135M-Instruct) on both SQLite and
PostgreSQL. Every check on a recorded interaction compares it with what the engine itself
sampled: greedy generation is deterministic, so asking the engine directly with the
recorded prompt ids must give the recorded completion ids.

What needs no real model (a group of n choices, top_k read and checked) runs on
``fake_stack``, the unit tier: the gateway app in-process on SQLite in front of the fake
engine (tests/gateway/fake_engine.py).
"""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from tests.gateway.helpers import wait_recorded

Q = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def tok(model_dir):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(model_dir))


def engine_greedy(stack, prompt_ids: list[int], max_new: int) -> dict:  # type: ignore[no-untyped-def]
    r = httpx.post(
        stack.engine.url + "/generate",
        timeout=120,
        json={
            "input_ids": prompt_ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0},
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_non_stream_is_recorded_token_exactly(stack, tok):
    client = stack.client()
    raw = client.chat.completions.with_raw_response.create(
        model="rlgate-policy", messages=Q, temperature=0, max_tokens=12
    )
    resp = raw.parse()
    assert resp.id.startswith("chatcmpl-")
    assert raw.headers["x-rlgate-interaction-id"] == resp.id
    assert raw.headers["x-rlgate-policy-version"] == "base"
    text = resp.choices[0].message.content
    assert text and resp.choices[0].finish_reason in ("stop", "length")

    (rec,) = wait_recorded(stack, [resp.id])
    assert rec.session_id == raw.headers["x-rlgate-session-id"]
    assert rec.policy_version == "base" and rec.temperature == 0 and rec.top_p == 1
    assert rec.prompt_token_ids == tok.apply_chat_template(
        Q, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    direct = engine_greedy(stack, rec.prompt_token_ids, 12)
    assert rec.completion_token_ids == direct["output_ids"]
    # the same prompt again is served from the engine's prefix cache, which with its
    # default int4 weights moves logprobs by up to ~0.1 (docs/engine.md, "Weights": 0.03
    # here); that the record holds exactly the logprobs the client was sent is
    # test_logprobs_in_openai_format's
    assert rec.completion_logprobs == pytest.approx(
        [t[0] for t in direct["meta_info"]["output_token_logprobs"]], abs=0.1
    )
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == text
    assert rec.output.text == text
    assert (
        rec.usage.completion_tokens == len(rec.completion_token_ids) == resp.usage.completion_tokens
    )
    assert rec.request["messages"] == Q


def test_stream_deltas_match_the_record(stack, tok):
    client = stack.client()
    chunks = list(
        client.chat.completions.create(
            model="rlgate-policy",
            messages=Q,
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 2  # real token-by-token streaming
    text = "".join(c.choices[0].delta.content for c in content_chunks)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    (rec,) = wait_recorded(stack, [chunks[0].id])
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == text
    assert rec.completion_token_ids == engine_greedy(stack, rec.prompt_token_ids, 12)["output_ids"]
    assert len(rec.completion_logprobs) == len(rec.completion_token_ids)
    assert chunks[-1].usage.completion_tokens == len(rec.completion_token_ids)


def test_n3_is_one_group(fake_stack):
    client = fake_stack.client()
    resp = client.chat.completions.create(
        model="rlgate-policy", messages=Q, n=3, temperature=1.0, max_tokens=8, seed=7
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    recs = wait_recorded(fake_stack, [f"{resp.id}.{i}" for i in range(3)])
    assert {r.group_id for r in recs} == {resp.id}
    assert [r.choice_index for r in recs] == [0, 1, 2]
    assert len({r.session_id for r in recs}) == 1
    for r, c in zip(recs, resp.choices, strict=True):
        assert r.output.text == c.message.content
        assert len(r.completion_logprobs) == len(r.completion_token_ids) > 0


def test_logprobs_in_openai_format(stack):
    client = stack.client()
    resp = client.chat.completions.create(
        model="rlgate-policy",
        messages=Q,
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
    )
    content = resp.choices[0].logprobs.content
    (rec,) = wait_recorded(stack, [resp.id])
    assert [c.logprob for c in content] == pytest.approx(rec.completion_logprobs, abs=1e-6)
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # greedy: the sampled token is the most likely one
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)


def test_top_k_is_read_and_checked(fake_stack):
    """``top_k`` (vLLM's and SGLang's extension) reaches the engine; 0 and -1 mean off;
    below -1 is a 400."""
    from gateway.api.openai_chat.translator import to_internal

    body = {"messages": Q}
    assert to_internal({**body, "top_k": 5}, None).sampling.values["top_k"] == 5
    assert to_internal({**body, "top_k": 0}, None).sampling.values["top_k"] == -1
    assert to_internal(body, None).sampling.values["top_k"] == -1
    fake_stack.client().chat.completions.create(
        model="m", messages=Q, max_tokens=2, extra_body={"top_k": 1}
    )
    assert fake_stack.engine.arrivals[-1]["sampling_params"]["top_k"] == 1
    r = httpx.post(
        fake_stack.gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {fake_stack.key()}"},
        json={"model": "m", "messages": Q, "top_k": -2},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"


def test_top_k_is_honoured(stack):
    """With k = 1, sampling at temperature 1 gives the greedy answer."""
    client = stack.client()
    greedy = client.chat.completions.create(
        model="m", messages=Q, temperature=0, max_tokens=12
    ).choices[0]
    for seed in (1, 2):
        k1 = client.chat.completions.create(
            model="m", messages=Q, temperature=1, max_tokens=12, seed=seed, extra_body={"top_k": 1}
        ).choices[0]
        assert k1.message.content == greedy.message.content
