"""OpenAI Completions (legacy) through the gateway, with the openai SDK and raw HTTP, on
the embedded engine (packaged model): every prompt form, n > 1, stop, logprobs as an int,
echo, streaming with usage, 400s in OpenAI's error shape, and the interaction recorded
with exactly the ids ``return_token_ids`` handed out.

What needs no real model's tokens (prompt forms, batches, stream shapes, 400s) runs on
``fake_stack``, the unit tier: the gateway app in-process on SQLite in front of the fake
engine (tests/gateway/fake_engine.py); stop sequences, logprobs, echo with the prompt's
logprobs and a client leaving a long stream need the real engine (``stack``)."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import func, select
from transformers import AutoTokenizer

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.tables import InteractionRow
from tests.gateway.fake_engine import in_process_gateway
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


def test_token_id_prompts_and_batches_with_n(fake_stack, tok):
    key = fake_stack.key()
    ids = tok.encode(PROMPT)
    r = post(fake_stack, key, {"prompt": ids, "max_tokens": 3, "temperature": 0, **RAW})
    assert r.status_code == 200, r.text
    (one,) = r.json()["choices"]
    assert one["prompt_token_ids"] == ids

    other = tok.encode("One, two, three,")
    body = {"prompt": [ids, other], "max_tokens": 3, "n": 2, "seed": 5, **RAW}
    r = post(fake_stack, key, body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [ids, ids, other, other]
    assert r.json()["usage"]["prompt_tokens"] == len(ids) + len(other)
    first, second = r.headers["x-rlgate-interaction-ids"].split(",")
    assert first == r.json()["id"]
    recs = wait_recorded(fake_stack, [f"{first}.0", f"{first}.1", f"{second}.0", f"{second}.1"])
    assert [rec.completion_token_ids for rec in recs] == [c["token_ids"] for c in choices]
    assert recs[0].group_id == first and recs[2].group_id == second

    r = post(fake_stack, key, {"prompt": ["Hello", "Goodbye"], "max_tokens": 2, "temperature": 0})
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

    # echo with logprobs: the prompt's tokens first (the first has no logprob), as vLLM
    r = post(stack, key, {**base, "echo": True, "logprobs": 2, **RAW})
    assert r.status_code == 200, r.text
    ec = r.json()["choices"][0]
    elp, prompt_ids = ec["logprobs"], ec["prompt_token_ids"]
    assert ec["text"] == PROMPT + full == "".join(elp["tokens"])
    assert len(elp["tokens"]) == len(prompt_ids) + len(ec["token_ids"])
    assert elp["token_logprobs"][0] is None and elp["top_logprobs"][0] is None
    n = len(prompt_ids)
    assert all(x <= 0 for x in elp["token_logprobs"][1:n])
    for k in range(1, n):
        alts = elp["top_logprobs"][k]
        assert 2 <= len(alts) <= 3 and elp["token_logprobs"][k] <= max(alts.values()) + 1e-6
    assert elp["token_logprobs"][n:] == pytest.approx(lp["token_logprobs"], abs=1e-4)
    assert elp["text_offset"][n] == len(PROMPT)


def sse(r: httpx.Response) -> list:  # type: ignore[no-untyped-def]
    lines = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_stream_with_usage_and_token_ids(fake_stack, tok):
    key = fake_stack.key()
    base = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    plain = post(fake_stack, key, base).json()["choices"][0]["text"]
    body = {**base, "stream": True, "stream_options": {"include_usage": True}, "echo": True}
    r = post(fake_stack, key, {**body, **RAW})
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
    (rec,) = wait_recorded(fake_stack, [chunks[0]["id"]])
    assert rec.completion_token_ids == ids
    assert rec.prompt_token_ids == tok.encode(PROMPT)


@SQLITE
def test_stream_echo_with_logprobs_of_two_prompts(stack, tok):
    key = stack.key()
    prompts = [PROMPT, "One, two"]
    base = {"prompt": prompts, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    whole = post(stack, key, base).json()["choices"]
    chunks = sse(post(stack, key, {**base, "stream": True}))
    firsts: dict[int, dict] = {}
    texts: dict[int, str] = {}
    for c in chunks:
        for ch in c["choices"]:
            firsts.setdefault(ch["index"], ch)
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    assert sorted(firsts) == [0, 1]
    for k, prompt in enumerate(prompts):
        head, want = firsts[k], whole[k]["logprobs"]
        n = len(tok.encode(prompt))
        assert head["text"] == prompt and texts[k] == whole[k]["text"]
        lp = head["logprobs"]
        assert lp["tokens"] == want["tokens"][:n] and "".join(lp["tokens"]) == prompt
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(want["token_logprobs"][1:n], abs=1e-3)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({}, "prompt", "prompt"),
        ({"prompt": [1, "a"]}, "prompt", "token ids"),
        ({"prompt": []}, "prompt", "prompt must be"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": [10**9]}, "prompt", "vocabulary"),
        ({"prompt": "x", "suffix": "y"}, "suffix", "fill-in-the-middle"),
        ({"prompt": "x", "logprobs": 50}, "logprobs", "20"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"prompt": "x", "best_of": 3}, "best_of", "best_of"),
        ({"prompt": "x", "bogus": 1}, "bogus", "unsupported"),
    ],
)
def test_bad_input_is_a_400_in_openai_shape(fake_stack, body, param, says):
    r = post(fake_stack, fake_stack.key(), {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert says in err["message"]


def rows_of(factory, ids: list[str]) -> int:  # type: ignore[no-untyped-def]
    """How many interactions of these calls (their ids, with or without a choice suffix)
    are in the database."""
    with factory() as db:
        return sum(
            db.scalar(
                select(func.count())
                .select_from(InteractionRow)
                .where(InteractionRow.id.like(f"{i}%"))
            )
            for i in ids
        )


def test_multi_prompt_stream_with_the_sdk_is_recorded_like_the_batch(fake_stack, tok):
    client = fake_stack.client()
    prompts = [PROMPT, "One, two, three,"]
    raw = client.completions.with_raw_response.create(
        model="rlgate-policy",
        prompt=prompts,
        n=2,
        max_tokens=5,
        seed=11,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=RAW,
    )
    first, second = raw.headers["x-rlgate-interaction-ids"].split(",")
    chunks = list(raw.parse())
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    body = chunks[:-1]
    assert {c.id for c in body} == {first}
    texts: dict[int, str] = {}
    ids: dict[int, list[int]] = {}
    prompt_ids: dict[int, list[int]] = {}
    finishes: dict[int, str] = {}
    for c in body:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            extra = ch.model_extra or {}
            ids.setdefault(ch.index, []).extend(extra.get("token_ids") or [])
            if "prompt_token_ids" in extra:
                prompt_ids[ch.index] = extra["prompt_token_ids"]
            if ch.finish_reason:
                assert ch.index not in finishes
                finishes[ch.index] = ch.finish_reason
    assert sorted(texts) == sorted(finishes) == [0, 1, 2, 3]  # prompt k, sample j: k * n + j
    want = [tok.encode(p) for p in prompts]
    assert [prompt_ids[i] for i in range(4)] == [want[0], want[0], want[1], want[1]]
    assert usage.prompt_tokens == len(want[0]) + len(want[1])
    assert usage.completion_tokens == sum(len(v) for v in ids.values())

    recs = wait_recorded(fake_stack, [f"{first}.0", f"{first}.1", f"{second}.0", f"{second}.1"])
    assert [r.completion_token_ids for r in recs] == [ids[i] for i in range(4)]
    assert [r.prompt_token_ids for r in recs] == [want[0], want[0], want[1], want[1]]
    assert [r.group_id for r in recs] == [first, first, second, second]
    assert [r.finish_reason for r in recs] == [finishes[i] for i in range(4)]
    assert all(r.request["prompt"] == prompts for r in recs)
    for i, r in enumerate(recs):
        assert texts[i] == tok.decode(r.completion_token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_with_a_too_long_prompt_is_one_400_naming_it(fake_stack, stream):
    key = fake_stack.key(project=f"long-{stream}")
    long = "word " * 3000  # over the engine's 2048-token context
    body = {"prompt": ["Hello", long, "Bye"], "max_tokens": 2, "stream": stream}
    r = post(fake_stack, key, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "prompt[1]"
    assert err["message"].startswith("prompt 1 (of 3") and "context" in err["message"]
    with fake_stack.factory() as db:
        n = db.scalar(
            select(func.count())
            .select_from(InteractionRow)
            .where(InteractionRow.project_id == f"long-{stream}")
        )
    assert n == 0


def leave_stream(stack, key: str, prompt) -> list[str]:  # type: ignore[no-untyped-def]
    """Stream a long answer to ``prompt`` and leave after four events; the interaction
    ids of the call."""
    # seeded (reproducible on the embedded engine): an unseeded sample could end with EOS
    # within four events, before the client leaves
    body = {"prompt": prompt, "max_tokens": 300, "temperature": 1.0, "stream": True, "seed": 7}
    with (
        httpx.Client(timeout=120) as c,
        c.stream(
            "POST",
            stack.gw.url + "/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
        ) as r,
    ):
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen >= 4:
                break
        return r.headers["x-rlgate-interaction-ids"].split(",")


@SQLITE
def test_a_batch_stream_the_client_leaves_records_nothing(stack):
    key = stack.key()
    batch = leave_stream(stack, key, ["Tell a long story.", "Write a poem."])
    # a call after it is recorded; the left batch (aborted at once) never is
    after = post(stack, key, {"prompt": "Hi", "max_tokens": 2}).json()["id"]
    wait_recorded(stack, [after])
    assert rows_of(stack.factory, batch) == 0


@SQLITE
def test_a_lone_prompt_stream_the_client_leaves_is_recorded_as_abort(stack):
    (iid,) = leave_stream(stack, stack.key(), "Tell a long story.")
    (rec,) = wait_recorded(stack, [iid], timeout=30)
    assert rec.finish_reason == "abort"
    assert 0 < len(rec.completion_token_ids) < 300


def test_an_engine_refusal_mid_batch_records_nothing(db_url, engine, tmp_path):
    """With room for one engine request at a time, the second prompt of a batch is
    refused (429; no waiting for a slot) while the first generates: the first is
    cancelled, nothing recorded."""
    upgrade(db_url)
    factory = session_factory(make_engine(db_url))
    with transaction(factory) as db:
        _, secret = create_key(db, "batch", "agent")
    h = {"Authorization": f"Bearer {secret}"}
    body = {"prompt": ["Tell a long story.", "Write a poem."], "max_tokens": 200}
    with in_process_gateway(
        tmp_path / "gw", db_url, engine.url, max_in_flight_per_engine="1", engine_queue_wait_s="0"
    ) as gw:
        for stream in (False, True):
            r = httpx.post(
                gw.url + "/v1/completions", headers=h, timeout=120, json={**body, "stream": stream}
            )
            assert r.status_code == 429, r.text
            assert r.json()["error"]["type"] == "rate_limit_error"
        ok = httpx.post(
            gw.url + "/v1/completions",
            headers=h,
            timeout=120,
            json={"prompt": "Hi", "max_tokens": 2},
        )
        assert ok.status_code == 200, ok.text
        wait_recorded(type("S", (), {"factory": factory})(), [ok.json()["id"]])
        with factory() as db:
            assert db.scalar(select(func.count()).select_from(InteractionRow)) == 1
