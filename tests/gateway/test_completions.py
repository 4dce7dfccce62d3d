"""OpenAI Completions (legacy) through the gateway, with the openai SDK and raw HTTP, on
the embedded engine (packaged model): every prompt form, n > 1, stop, logprobs as an int,
echo, streaming with usage, 400s in OpenAI's error shape, and the interaction recorded
with exactly the ids ``return_token_ids`` handed out."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoTokenizer

from tests.gateway.helpers import wait_recorded

PROMPT = "The capital of France is"
RAW = {"return_token_ids": True}
SQLITE = pytest.mark.parametrize("stack", ["sqlite"], indirect=True)


@pytest.fixture(scope="module")
def tok(model_dir):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(model_dir))


def post(stack, key: str, body: dict) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(
        stack.gw.url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def test_text_prompt_is_raw_and_recorded_with_the_returned_ids(stack, tok):
    client = stack.client()
    raw = client.completions.with_raw_response.create(
        model="rlgate-policy", prompt=PROMPT, max_tokens=6, temperature=0, extra_body=RAW
    )
    resp = raw.parse()
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    (choice,) = resp.choices
    extra = choice.model_extra
    assert extra["prompt_token_ids"] == tok.encode(PROMPT)  # no chat template
    assert choice.text == tok.decode(extra["token_ids"], skip_special_tokens=True)
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens == len(extra["prompt_token_ids"])
    assert resp.usage.completion_tokens == len(extra["token_ids"])

    (rec,) = wait_recorded(stack, [resp.id])
    assert rec.session_id == raw.headers["x-rlgate-session-id"]
    assert rec.prompt_token_ids == extra["prompt_token_ids"]
    assert rec.completion_token_ids == extra["token_ids"]
    assert len(rec.completion_logprobs) == len(extra["token_ids"])
    assert rec.policy_version == "base" and rec.temperature == 0
    assert rec.request["prompt"] == PROMPT


@SQLITE
def test_token_id_prompts_and_batches_with_n(stack, tok):
    key = stack.key()
    ids = tok.encode(PROMPT)
    r = post(stack, key, {"prompt": ids, "max_tokens": 3, "temperature": 0, **RAW})
    assert r.status_code == 200, r.text
    (one,) = r.json()["choices"]
    assert one["prompt_token_ids"] == ids

    other = tok.encode("One, two, three,")
    body = {"prompt": [ids, other], "max_tokens": 3, "n": 2, "seed": 5, **RAW}
    r = post(stack, key, body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [ids, ids, other, other]
    assert r.json()["usage"]["prompt_tokens"] == len(ids) + len(other)
    first, second = r.headers["x-rlgate-interaction-ids"].split(",")
    assert first == r.json()["id"]
    recs = wait_recorded(stack, [f"{first}.0", f"{first}.1", f"{second}.0", f"{second}.1"])
    assert [rec.completion_token_ids for rec in recs] == [c["token_ids"] for c in choices]
    assert recs[0].group_id == first and recs[2].group_id == second

    r = post(stack, key, {"prompt": ["Hello", "Goodbye"], "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2


@SQLITE
def test_stop_logprobs_and_echo(stack, tok):
    key = stack.key()
    base = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    full = post(stack, key, base).json()["choices"][0]["text"]
    cut = full.strip()[2:4]
    assert cut, full
    stopped = post(stack, key, {**base, "stop": [cut]}).json()["choices"][0]
    assert stopped["text"] == full[: full.index(cut)]
    assert stopped["finish_reason"] == "stop"

    c = post(stack, key, {**base, "logprobs": 2}).json()["choices"][0]
    lp = c["logprobs"]
    assert "".join(lp["tokens"]) == c["text"] == full
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"])
    for k, (token, alts) in enumerate(zip(lp["tokens"], lp["top_logprobs"], strict=True)):
        assert 2 <= len(alts) <= 3 and alts[token] == lp["token_logprobs"][k]
        assert max(alts.values()) == pytest.approx(lp["token_logprobs"][k])  # greedy
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"][1] == len(lp["tokens"][0])

    e = post(stack, key, {**base, "echo": True}).json()["choices"][0]
    assert e["text"] == PROMPT + full


def sse(r: httpx.Response) -> list:  # type: ignore[no-untyped-def]
    lines = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_stream_with_usage_and_token_ids(stack, tok):
    key = stack.key()
    base = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    plain = post(stack, key, base).json()["choices"][0]["text"]
    body = {**base, "stream": True, "stream_options": {"include_usage": True}, "echo": True}
    r = post(stack, key, {**body, **RAW})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = sse(r)
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == tok.encode(PROMPT)
    texts = "".join(ch["text"] for c in chunks for ch in c["choices"])
    assert texts == PROMPT + plain
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids", [])]
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert len(finishes) == 1
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == len(ids)
    (rec,) = wait_recorded(stack, [chunks[0]["id"]])
    assert rec.completion_token_ids == ids
    assert rec.prompt_token_ids == tok.encode(PROMPT)


@SQLITE
@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({}, "prompt", "prompt"),
        ({"prompt": [1, "a"]}, "prompt", "token ids"),
        ({"prompt": []}, "prompt", "prompt must be"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": [10**9]}, "prompt", "vocabulary"),
        ({"prompt": "x", "suffix": "y"}, "suffix", "fill-in-the-middle"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo", "prompt's logprobs"),
        ({"prompt": ["a", "b"], "stream": True}, "prompt", "one prompt"),
        ({"prompt": "x", "logprobs": 50}, "logprobs", "20"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"prompt": "x", "best_of": 3}, "best_of", "best_of"),
        ({"prompt": "x", "bogus": 1}, "bogus", "unsupported"),
    ],
)
def test_bad_input_is_a_400_in_openai_shape(stack, body, param, says):
    r = post(stack, stack.key(), {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert says in err["message"]
