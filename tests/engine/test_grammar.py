"""Grammar-constrained sampling (SGLang's json_schema / regex / ebnf) on the real model:
the output matches the constraint, logprobs are those of the masked distribution, and a
constraint that cannot compile is a 400 that leaves the engine serving."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from tests.engine.conftest import chat_prompt

pytestmark = pytest.mark.timeout(180)

SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


def _out(generate, client, tokenizer, question: str, **params: object):  # type: ignore[no-untyped-def]
    return generate(
        client,
        input_ids=chat_prompt(tokenizer, question),
        sampling_params={"max_new_tokens": 40, **params},
        return_logprob=True,
    )


def test_json_schema_output_validates(generate, client, tokenizer) -> None:  # type: ignore[no-untyped-def]
    for seed in (1, 2, 3):
        out = _out(
            generate,
            client,
            tokenizer,
            "Pick a colour.",
            json_schema=json.dumps(SCHEMA),
            temperature=1.0,
            seed=seed,
        )
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        assert all(math.isfinite(lp) for lp in logprobs)


def test_regex_and_ebnf(generate, client, tokenizer) -> None:  # type: ignore[no-untyped-def]
    out = _out(generate, client, tokenizer, "What is 12 * 12?", regex=r"[0-9]{3}", temperature=0)
    assert re.fullmatch(r"[0-9]{3}", out["text"]), out["text"]
    out = _out(
        generate, client, tokenizer, "Is the sky blue?", ebnf='root ::= "yes" | "no"', temperature=0
    )
    assert out["text"] in ("yes", "no")


def test_masked_logprobs_are_renormalized(generate, client, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Greedy under a regex that admits exactly the unconstrained greedy answer: the same
    tokens, each with a logprob at least as high (the mask removes mass, never adds)."""
    free = _out(generate, client, tokenizer, "Say hello.", temperature=0, max_new_tokens=6)
    free_ids = free["meta_info"]["output_token_logprobs"]
    text = free["text"]
    assert text
    constrained = _out(
        generate, client, tokenizer, "Say hello.", temperature=0, regex=re.escape(text)
    )
    got = constrained["meta_info"]["output_token_logprobs"]
    assert constrained["text"] == text
    assert [t for _, t, _ in got[: len(free_ids)]] == [t for _, t, _ in free_ids]
    for (lp_c, _, _), (lp_f, _, _) in zip(got, free_ids, strict=False):
        assert lp_c >= lp_f - 1e-5


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"json_schema": '{"type": 5}'}, "json_schema cannot be compiled"),
        ({"json_schema": "not json"}, "json_schema cannot be compiled"),
        ({"regex": "("}, "regex cannot be compiled"),
        ({"regex": "a", "json_schema": "{}"}, "only one of"),
        ({"regex": "a", "structural_tag": "{}"}, "only one of"),
        ({"structural_tag": '{"structures": [], "triggers": []}'}, "legacy structural_tag"),
        (
            {"structural_tag": '{"type": "structural_tag", "format": {"type": "any_text"}}'},
            "any_text is supported only as a tag's content",
        ),
        (
            {
                "structural_tag": json.dumps(
                    {
                        "type": "structural_tag",
                        "format": {"type": "json_schema", "json_schema": {"type": 5}},
                    }
                )
            },
            "structural_tag cannot be compiled",
        ),
    ],
)
def test_bad_constraints_are_400(client, generate, tokenizer, params, needle) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": params})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    out = _out(generate, client, tokenizer, "Hi", max_new_tokens=2)  # still serving
    assert out["meta_info"]["completion_tokens"] >= 1
