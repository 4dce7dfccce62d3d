"""Prefix reuse: a request whose prompt starts like a running sequence's copies that
sequence's cached keys/values and prefills only the rest. Real packaged model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from engine.llama import KVCache, LlamaModel
from tests.engine.conftest import chat_prompt

pytestmark = pytest.mark.timeout(300)


def test_prefill_from_a_copied_prefix_equals_full_prefill(model_dir: Path, chat_ids) -> None:  # type: ignore[no-untyped-def]
    model = LlamaModel(model_dir)
    cache = KVCache(model.cfg, 3, 256, model.dtype)
    donor, ids = chat_ids[0], chat_ids[1]
    shared = next(i for i, (a, b) in enumerate(zip(donor, ids, strict=False)) if a != b)
    assert shared > 10  # the chat template's system prompt

    model.prefill(donor, 0, cache, None)
    full = model.prefill(ids, 1, cache, None)
    cache.move(0, 2, shared)
    reused = model.prefill(ids, 2, cache, None, start=shared)

    torch.testing.assert_close(reused, full, atol=1e-4, rtol=1e-4)
    for k in cache.k + cache.v:
        torch.testing.assert_close(k[2, :, : len(ids)], k[1, :, : len(ids)], atol=1e-4, rtol=1e-4)
    # and decoding on from either slot gives the same next-token distribution
    nxt = torch.tensor([int(full.argmax())] * 2)
    pos = torch.tensor([len(ids)] * 2)
    cache.move(1, 0, len(ids))
    cache.move(2, 1, len(ids))
    logits = model.decode(nxt, pos, cache, None)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="prefill start"):
        model.prefill(ids, 2, cache, None, start=len(ids))


def test_concurrent_requests_reuse_the_shared_prompt(generate, client, chat_ids) -> None:  # type: ignore[no-untyped-def]
    bodies = [
        {
            "input_ids": ids,
            "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
        }
        for ids in chat_ids
    ]
    before = client.get("/get_server_info").json()["prefix_reused_tokens"]
    serial = [generate(client, **b) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: generate(client, **b), bodies))
    # same tokens; logprobs equal up to float error
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in serial]
    for a, b in zip(together, serial, strict=True):
        la = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
        lb = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
        assert la == pytest.approx(lb, abs=1e-3)
    cached = [r["meta_info"]["cached_tokens"] for r in together]
    assert max(cached) > 10, cached  # later arrivals copied the system prompt
    assert all(c < len(ids) for c, ids in zip(cached, chat_ids, strict=True))
    after = client.get("/get_server_info").json()["prefix_reused_tokens"]
    assert after - before >= sum(cached)


def test_n_samples_of_one_prompt_prefill_once(generate, client, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = chat_prompt(tokenizer, "Name a bird that cannot fly.")
    many = generate(
        client,
        input_ids=ids,
        sampling_params={"temperature": 1.0, "max_new_tokens": 6, "n": 4},
    )
    cached = sorted(m["meta_info"]["cached_tokens"] for m in many)
    # the first is prefilled after the shared system prompt at most (a new question);
    # the others copy all but the last prompt token from it
    assert cached[0] < len(ids) - 5
    assert cached[1:] == [len(ids) - 1] * 3


def test_next_turn_reuses_the_finished_turn(
    generate, client, hf_model, hf_greedy, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    """A finished sequence stays in a spare slot: the next call of the conversation (its
    prompt extends the previous prompt + answer) copies it instead of prefilling again,
    and generates exactly what a full prefill would."""
    first = chat_prompt(tokenizer, "Tell me one fact about the moon.")
    out = generate(
        client, input_ids=first, sampling_params={"temperature": 0, "max_new_tokens": 12}
    )
    turn = first + out["output_ids"]
    follow = tokenizer(
        "\n<|im_start|>user\nAnd one about the sun.<|im_end|>\n<|im_start|>assistant\n"
    )
    second = turn + list(follow["input_ids"])
    out2 = generate(
        client, input_ids=second, sampling_params={"temperature": 0, "max_new_tokens": 12}
    )
    held = len(turn) - 1  # the last sampled token was never fed back, so it has no KV
    assert out2["meta_info"]["cached_tokens"] >= held
    assert out2["output_ids"] == hf_greedy(hf_model, second, 12, [2])


def test_prefill_batch_equals_one_by_one(model_dir: Path, chat_ids) -> None:  # type: ignore[no-untyped-def]
    model = LlamaModel(model_dir)
    cache = KVCache(model.cfg, 8, 256, model.dtype)
    alone = [model.prefill(ids, slot, cache, None) for slot, ids in enumerate(chat_ids[:3])]
    # slot 3: a copied prefix of slot 0's prompt plus the rest of prompt 1
    shared = next(
        i for i, (a, b) in enumerate(zip(chat_ids[0], chat_ids[1], strict=False)) if a != b
    )
    cache.move(0, 3, shared)
    items = [(chat_ids[0], 4, 0), (chat_ids[1], 3, shared), (chat_ids[2], 5, 0)]
    together = model.prefill_batch(items, cache, None)
    torch.testing.assert_close(together, torch.stack(alone), atol=1e-4, rtol=1e-4)
    for k in cache.k + cache.v:
        for slot, ids in ((4, chat_ids[0]), (3, chat_ids[1]), (5, chat_ids[2])):
            ref = {4: 0, 3: 1, 5: 2}[slot]
            torch.testing.assert_close(
                k[slot, :, : len(ids)], k[ref, :, : len(ids)], atol=1e-4, rtol=1e-4
            )
