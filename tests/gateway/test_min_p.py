"""``min_p`` (vLLM's and SGLang's extension) on Chat Completions and Responses: checked to
[0, 1], sent to the engine and recorded on the interaction beside the other sampling
params. ``min_p = 1`` keeps only the likeliest token, so a hot sample equals the greedy
answer: that it does shows the engine sampled with it."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.helpers import wait_recorded

Q = [{"role": "user", "content": "Name three colours."}]


def test_min_p_is_sent_and_recorded(stack) -> None:  # type: ignore[no-untyped-def]
    client = stack.client()
    greedy = client.chat.completions.create(
        model="rlgate-policy", messages=Q, temperature=0, max_tokens=12
    )
    hot = client.chat.completions.create(
        model="rlgate-policy",
        messages=Q,
        temperature=1.5,
        max_tokens=12,
        extra_body={"min_p": 1.0},
    )
    resp = client.responses.create(
        model="rlgate-policy",
        input="Say hello.",
        max_output_tokens=4,
        extra_body={"min_p": 0.25},
    )
    rec_greedy, rec_hot, rec_resp = wait_recorded(stack, [greedy.id, hot.id, resp.id])
    assert (rec_greedy.min_p, rec_hot.min_p, rec_resp.min_p) == (0.0, 1.0, 0.25)
    assert rec_hot.temperature == 1.5
    assert rec_hot.completion_token_ids == rec_greedy.completion_token_ids


@pytest.mark.parametrize("value", [1.5, -0.1])
def test_out_of_range_min_p_is_openai_400(fake_stack, value) -> None:  # type: ignore[no-untyped-def]
    """Refused before an engine is asked, on any database: the unit tier's stack."""
    client = fake_stack.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="rlgate-policy", messages=Q, max_tokens=4, extra_body={"min_p": value}
        )
    body = e.value.response.json()
    assert body["error"]["type"] == "invalid_request_error" and "min_p" in body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model="rlgate-policy", input="hi", max_output_tokens=4, extra_body={"min_p": value}
        )
    assert e.value.response.json()["error"]["param"] == "min_p"
