"""Frequency and presence penalties on the embedded engine: applied to the tokens
generated so far (OpenAI's and SGLang's semantics), and the reported logprobs are those
of the penalized distribution, checked against a recomputation with transformers."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytestmark = pytest.mark.timeout(300)


def _greedy(generate, client, ids, **params):  # type: ignore[no-untyped-def]
    body = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True, **params}
    return generate(client, input_ids=ids, return_logprob=True, sampling_params=body)


def test_frequency_penalty_stops_repeating(generate, client, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode(" hello" * 24)
    plain = _greedy(generate, client, ids)["output_ids"]
    assert Counter(plain).most_common(1)[0][1] >= 8  # the model keeps repeating
    penalized = _greedy(generate, client, ids, frequency_penalty=2.0)["output_ids"]
    assert penalized[0] == plain[0]  # nothing generated yet: the prompt is not counted
    assert Counter(penalized).most_common(1)[0][1] < Counter(plain).most_common(1)[0][1]


@pytest.mark.parametrize(
    ("freq", "pres", "temperature"), [(1.5, 0.0, 0.0), (0.0, 1.0, 0.0), (0.8, 0.6, 0.7)]
)
def test_logprobs_are_of_the_penalized_distribution(  # type: ignore[no-untyped-def]
    generate, client, hf_model, tokenizer, freq, pres, temperature
) -> None:
    prompt = tokenizer.encode(" hello" * 24)  # the penalties move a lot of mass here
    out = generate(
        client,
        input_ids=prompt,
        return_logprob=True,
        sampling_params={
            "temperature": temperature,
            "max_new_tokens": 12,
            "frequency_penalty": freq,
            "presence_penalty": pres,
            "seed": 3,
        },
    )
    got = out["output_ids"]
    lps = [t[0] for t in out["meta_info"]["output_token_logprobs"]]
    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt + got])).logits[0].float()
    scale = temperature if temperature > 0 else 1.0
    for pos, tid in enumerate(got):
        step = logits[len(prompt) - 1 + pos].clone()
        counts = Counter(got[:pos])
        for t, c in counts.items():
            step[t] -= freq * c + pres
        ref = torch.log_softmax(step / scale, dim=-1)
        assert abs(lps[pos] - float(ref[tid])) < 1e-3, pos
        if temperature == 0:
            assert tid == int(step.argmax())
    unpenalized = torch.log_softmax(logits[len(prompt) - 1 : -1] / scale, dim=-1)
    plain = [float(unpenalized[i, t]) for i, t in enumerate(got)]
    assert max(abs(a - b) for a, b in zip(lps, plain, strict=True)) > 1e-3  # it did change
