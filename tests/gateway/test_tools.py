"""Tool calls: parsers on their own, then a real tool call from the real model.

SmolLM2-135M does not call tools on its own, so the end-to-end test first teaches it one:
a LoRA adapter is fitted (PEFT, a few dozen steps on CPU) to answer one prompt with a
Hermes `<tool_call>`. The adapter is loaded into the engine and made the project's serving
policy, so the call goes through the product's real path: serving pointer -> engine with
`lora_path` -> decoded text -> tool-call parser -> `finish_reason: tool_calls` -> record.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from core.db import transaction
from core.keys import ensure_project
from gateway.call.parsing import (
    HermesToolParser,
    Llama3JsonToolParser,
    StreamingParser,
    parse_output,
)
from gateway.call.request import Message, Tool
from gateway.call.templating import ChatRenderer, load_tokenizer
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow
from tests.gateway.helpers import wait_recorded

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What is 7 + 5? Use the add tool."}]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 7, "b": 5}}\n</tool_call>'
PROJECT = "ptools"
ADAPTER = "ptools-policy-v1"


# ---- parsers ----------------------------------------------------------------------


def test_hermes_parser():
    content, calls = HermesToolParser().parse("Sure.\n" + CALL_TEXT)
    assert content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 7, "b": 5})]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        "<tool_call> unterminated",
    ],
)
def test_malformed_tool_call_stays_text(text):
    content, reasoning, calls = parse_output(text, "hermes", False)
    assert calls == [] and content == text and reasoning is None


def test_llama3_json_parser():
    _, calls = Llama3JsonToolParser().parse('{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert calls[0].name == "add" and json.loads(calls[0].arguments) == {"a": 1, "b": 2}


def test_reasoning_split():
    content, reasoning, _ = parse_output("<think>hmm</think>42", None, True)
    assert (content, reasoning) == ("42", "hmm")


def test_streaming_parser_holds_back_markers():
    p = StreamingParser(HermesToolParser(), reasoning=False)
    out = [
        p.feed(piece)
        for piece in [
            "Sure. <to",
            'ol_call>\n{"name": "add", ',
            '"arguments": {"a": 7}}\n</tool',
            "_call>",
        ]
    ]
    out.append(p.feed("", final=True))
    assert "".join(d.content for d in out) == "Sure. "
    calls = [c for d in out for c in d.tool_calls]
    assert [c.name for c in calls] == ["add"]


# ---- a real tool call through the gateway -----------------------------------------


@pytest.fixture(scope="session")
def tool_adapter(model_dir, engine, tmp_path_factory):  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(model_dir)
    renderer = ChatRenderer(tok, 2048)
    tools = [Tool("add", ADD["function"]["description"], ADD["function"]["parameters"])]
    _, prompt = renderer.render([Message("user", ASK[0]["content"])], tools)
    target = tok.encode(CALL_TEXT, add_special_tokens=False) + [tok.eos_token_id]

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    )
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(60):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.02:
            break
    out = tmp_path_factory.mktemp("tool-adapter") / ADAPTER
    model.save_pretrained(str(out))
    r = httpx.post(
        engine.url + "/load_lora_adapter",
        timeout=60,
        json={"lora_name": ADAPTER, "lora_path": str(out)},
    )
    assert r.status_code == 200, r.text
    return out


@pytest.fixture
def serving_tool_adapter(stack, tool_adapter):  # type: ignore[no-untyped-def]
    with transaction(stack.factory) as db:
        if db.get(PolicyVersionRow, f"pv-{ADAPTER}") is None:
            ensure_project(db, PROJECT)
            db.add(
                PolicyVersionRow(
                    id=f"pv-{ADAPTER}",
                    project_id=PROJECT,
                    name=ADAPTER,
                    version=1,
                    base_model="smollm2-135m-instruct",
                    path=str(tool_adapter),
                    lora_config={"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
                    status="serving",
                    created_at=utcnow(),
                    eval_metrics={},
                )
            )
    return stack.client(stack.key("agent", PROJECT))


def test_tool_call_and_follow_up(stack, serving_tool_adapter):
    client = serving_tool_adapter
    raw = client.chat.completions.with_raw_response.create(
        model="rlgate-policy", messages=ASK, tools=[ADD], temperature=0, max_tokens=40
    )
    resp = raw.parse()
    assert raw.headers["x-rlgate-policy-version"] == ADAPTER
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 7, "b": 5}

    (rec,) = wait_recorded(stack, [resp.id])
    assert rec.policy_version == ADAPTER
    assert rec.finish_reason == "tool_calls"
    assert rec.output.tool_calls[0].name == "add"

    follow = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "add", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "12"},
    ]
    raw2 = client.chat.completions.with_raw_response.create(
        model="rlgate-policy", messages=follow, tools=[ADD], temperature=0, max_tokens=20
    )
    resp2 = raw2.parse()
    assert resp2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert raw2.headers["x-rlgate-session-id"] == raw.headers["x-rlgate-session-id"]
    (rec2,) = wait_recorded(stack, [resp2.id])
    assert rec2.parent_id == rec.id
    assert rec2.prompt_token_ids[: len(rec.prompt_token_ids)] == rec.prompt_token_ids


def test_tool_call_streams_as_a_delta(stack, serving_tool_adapter, model_dir):
    chunks = list(
        serving_tool_adapter.chat.completions.create(
            model="rlgate-policy",
            messages=ASK,
            tools=[ADD],
            temperature=0,
            max_tokens=40,
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "add"
    assert json.loads(calls[0].function.arguments) == {"a": 7, "b": 5}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    (rec,) = wait_recorded(stack, [chunks[0].id])
    tok = load_tokenizer(model_dir)
    assert tok.decode(rec.completion_token_ids, skip_special_tokens=True) == CALL_TEXT
