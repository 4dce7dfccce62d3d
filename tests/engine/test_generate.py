"""/generate on the real packaged model: equality with transformers, logprobs, batching,
streaming, stop conditions."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

pytestmark = pytest.mark.timeout(300)
EOS = [2]  # <|im_end|>: the tokenizer's eos and generation_config's eos of SmolLM2


def test_greedy_equals_transformers(generate, hf_greedy, client, hf_model, chat_ids) -> None:  # type: ignore[no-untyped-def]
    for ids in chat_ids[:3]:
        expected = hf_greedy(hf_model, ids, 24, EOS)
        out = generate(
            client, input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24}
        )
        assert out["output_ids"] == expected
        again = generate(
            client, input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24}
        )
        assert again["output_ids"] == out["output_ids"]
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == len(ids)
        assert meta["completion_tokens"] == len(expected)
        if expected[-1] in EOS:  # SGLang keeps the eos token in output_ids
            assert meta["finish_reason"] == {"type": "stop", "matched": expected[-1]}
        else:
            assert meta["finish_reason"]["type"] == "length"


def _recompute_logprobs(
    model,
    prompt: list[int],
    output: list[int],  # type: ignore[no-untyped-def]
    temperature: float,
) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    step_logits = logits[len(prompt) - 1 : len(prompt) + len(output) - 1]
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(step_logits / scale, dim=-1)


@pytest.mark.parametrize("temperature", [0.7, 1.3, 0.0])
def test_logprobs_match_recomputation(generate, client, hf_model, chat_ids, temperature) -> None:  # type: ignore[no-untyped-def]
    ids = chat_ids[1]
    out = generate(
        client,
        input_ids=ids,
        return_logprob=True,
        top_logprobs_num=3,
        sampling_params={
            "temperature": temperature,
            "top_p": 0.9,
            "top_k": 40,
            "max_new_tokens": 20,
            "seed": 7,
        },
    )
    meta = out["meta_info"]
    out_ids = out["output_ids"]
    assert len(out_ids) == meta["completion_tokens"] == len(meta["output_token_logprobs"])
    assert len(meta["output_top_logprobs"]) == len(out_ids)
    ref = _recompute_logprobs(hf_model, ids, out_ids, temperature)
    for pos, (lp, tid, text) in enumerate(meta["output_token_logprobs"]):
        assert tid == out_ids[pos] and text is None
        assert abs(lp - float(ref[pos, tid])) < 1e-4
        top = meta["output_top_logprobs"][pos]
        assert len(top) == 3
        ref_vals, ref_ids = torch.topk(ref[pos], 3)
        assert [t[1] for t in top] == ref_ids.tolist()
        for (value, _, _), ref_value in zip(top, ref_vals.tolist(), strict=True):
            assert abs(value - ref_value) < 1e-4


def test_seeded_sampling_is_reproducible(generate, client, chat_ids) -> None:  # type: ignore[no-untyped-def]
    body = {
        "input_ids": chat_ids[0],
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 12, "seed": 123},
    }
    assert generate(client, **body)["output_ids"] == generate(client, **body)["output_ids"]


def _concurrent(generate, client: httpx.Client, bodies: list[dict]) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: generate(client, **b), bodies))


def test_batching_is_invisible(generate, client, chat_ids) -> None:  # type: ignore[no-untyped-def]
    bodies = [
        {
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": 8 + 3 * i, "ignore_eos": True},
        }
        for i, ids in enumerate(chat_ids)
    ]
    serial = [generate(client, **b)["output_ids"] for b in bodies]
    together = [r["output_ids"] for r in _concurrent(generate, client, bodies)]
    assert together == serial
    # the same prompts as one batched request
    batch = generate(
        client, input_ids=chat_ids, sampling_params=[b["sampling_params"] for b in bodies]
    )
    assert [r["output_ids"] for r in batch] == serial


def test_text_input_and_n(generate, client, tokenizer) -> None:  # type: ignore[no-untyped-def]
    out = generate(
        client,
        text="The capital of France is",
        sampling_params={"temperature": 0, "max_new_tokens": 6},
    )
    by_ids = generate(
        client,
        input_ids=tokenizer("The capital of France is")["input_ids"],
        sampling_params={"temperature": 0, "max_new_tokens": 6},
    )
    assert out["output_ids"] == by_ids["output_ids"]
    assert out["text"] == tokenizer.decode(out["output_ids"], skip_special_tokens=True)
    many = generate(
        client,
        text="Once upon a time",
        rid="story",
        sampling_params={"temperature": 1.0, "max_new_tokens": 5, "n": 3},
    )
    assert isinstance(many, list) and len(many) == 3
    assert len({m["meta_info"]["id"] for m in many}) == 3


def test_stop_strings_and_tokens(generate, client, chat_ids, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = chat_ids[2]
    free = generate(
        client,
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
    )
    text = free["text"]
    stop = text[6:9]
    assert stop.strip(), text
    cut = generate(
        client,
        input_ids=ids,
        sampling_params={
            "temperature": 0,
            "max_new_tokens": 24,
            "stop": [stop],
            "ignore_eos": True,
        },
    )
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["text"] == text[: text.find(stop)]
    kept = generate(
        client,
        input_ids=ids,
        sampling_params={
            "temperature": 0,
            "max_new_tokens": 24,
            "stop": stop,
            "no_stop_trim": True,
            "ignore_eos": True,
        },
    )
    assert stop in kept["text"]
    # stop_token_ids act like eos (and, as in SGLang, are ignored with ignore_eos)
    plain = generate(
        client, input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24}
    )["output_ids"]
    token = plain[3]
    by_token = generate(
        client,
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 24, "stop_token_ids": [token]},
    )
    assert by_token["output_ids"] == plain[: plain.index(token) + 1]
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}
    assert by_token["text"] == tokenizer.decode(plain[: plain.index(token)])


def _stream(client: httpx.Client, body: dict) -> list[dict]:  # type: ignore[type-arg]
    chunks: list[dict] = []  # type: ignore[type-arg]
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert line.startswith("data: ")
        chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def test_streaming_matches_non_streaming(generate, client, chat_ids) -> None:  # type: ignore[no-untyped-def]
    body = {
        "input_ids": chat_ids[3],
        "return_logprob": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 16},
    }
    plain = generate(client, **body)
    chunks = _stream(client, body)
    assert len(chunks) == len(plain["output_ids"])
    for i, chunk in enumerate(chunks):  # cumulative, like SGLang's default
        assert chunk["output_ids"] == plain["output_ids"][: i + 1]
    last = chunks[-1]
    assert last["text"] == plain["text"]
    assert last["output_ids"] == plain["output_ids"]
    assert last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    # the second run copies the first one's cached prompt (prefix reuse): same tokens,
    # logprobs equal up to float rounding
    streamed = last["meta_info"]["output_token_logprobs"]
    expected = plain["meta_info"]["output_token_logprobs"]
    assert [t[1:] for t in streamed] == [t[1:] for t in expected]
    assert [t[0] for t in streamed] == pytest.approx([t[0] for t in expected], abs=1e-4)
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_abort_and_disconnect_free_the_slot(generate, client, engine_url, chat_ids) -> None:  # type: ignore[no-untyped-def]
    body = {
        "input_ids": chat_ids[0],
        "rid": "to-abort",
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 900, "ignore_eos": True},
    }
    with client.stream("POST", "/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # first chunk arrived: disconnect mid-generation
    aborted = {}

    def run() -> None:
        aborted.update(
            generate(
                client,
                input_ids=chat_ids[1],
                rid="abort-me",
                sampling_params={"temperature": 0, "max_new_tokens": 900, "ignore_eos": True},
            )
        )

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(run)
        _wait_for(lambda: client.get("/get_server_info").json()["running"] >= 1)
        time.sleep(0.3)
        client.post("/abort_request", json={"rid": "abort-me"})
        fut.result(timeout=60)
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert aborted["meta_info"]["completion_tokens"] < 900
    _wait_for(lambda: client.get("/get_server_info").json()["running"] == 0)
    assert client.get("/get_server_info").json()["waiting"] == 0
    # the engine still serves
    ok = generate(client, input_ids=chat_ids[0], sampling_params={"max_new_tokens": 2})
    assert ok["meta_info"]["completion_tokens"] == 2


def _wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
