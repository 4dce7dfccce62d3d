"""The sampling fields of a call are declared once, in schemas/sampling_fields.py: a field
added to the table is taken by the APIs it names (under their names, in their ranges: out
of range is a 400 naming it), reaches the engine's ``sampling_params`` when set, and, marked
``penalized``, keeps its records out of training. Unit tier: ``fake_stack`` (the gateway
in-process in front of a fake engine) and the table itself."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from engine.protocol import SamplingParamsIn
from gateway.api import base
from gateway.api.anthropic_messages import translator as messages_translator
from gateway.api.openai_chat import translator as chat_translator
from gateway.api.openai_completions import translator as completions_translator
from gateway.api.openai_responses import translator as responses_translator
from schemas import sampling_fields
from schemas.atdp import Interaction
from schemas.sampling_fields import CallField, Range, on
from schemas.tables import InteractionRow
from trainer import data

pytestmark = pytest.mark.unit

# api -> (the translator module that validates its requests, the name of its model there)
MODELS = {
    sampling_fields.CHAT: (chat_translator, "ChatRequest"),
    sampling_fields.COMPLETIONS: (completions_translator, "CompletionRequest"),
    sampling_fields.RESPONSES: (responses_translator, "ResponsesRequest"),
    sampling_fields.MESSAGES: (messages_translator, "MessagesRequest"),
}
# a field rlgate does not have: Chat takes it as ``typical_p``, Messages as ``typical``
TYPICAL = CallField(
    "typical_p",
    float,
    1.0,
    Range(gt=0, le=1),
    "locally typical sampling (a field made up for this test)",
    apis={**on(sampling_fields.CHAT), **on(sampling_fields.MESSAGES, name="typical")},
    trace="rlgate.request.typical_p",
)
Q = [{"role": "user", "content": "hi"}]
ANTH = {"anthropic-version": "2023-06-01"}


def test_every_field_is_served_and_recorded_where_the_table_says() -> None:
    for f in sampling_fields.FIELDS:
        assert f.sglang in SamplingParamsIn.model_fields, f"the embedded engine lacks {f.name}"
        if f.column:
            assert f.column in Interaction.model_fields and hasattr(InteractionRow, f.column)
    for api, (module, name) in MODELS.items():
        model = getattr(module, name)
        for _, a in sampling_fields.of_api(api):
            info = model.model_fields[a.name]
            bounds = {
                k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le") if hasattr(m, k)
            }
            assert {k: v for k, v in bounds.items() if v is not None} == {
                k: v for k, v in dataclasses.asdict(a.range).items() if v is not None
            }, f"{api} {a.name}"


@pytest.fixture
def typical(monkeypatch):  # type: ignore[no-untyped-def]
    """The table with TYPICAL added, and each API's request model made from it again."""
    monkeypatch.setattr(sampling_fields, "FIELDS", (*sampling_fields.FIELDS, TYPICAL))
    for api, (module, name) in MODELS.items():
        monkeypatch.setattr(module, name, base.with_call_fields(api)(getattr(module, name)))


def _http(stack) -> httpx.Client:  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {stack.key()}"}
    return httpx.Client(base_url=stack.gw.url, headers=headers, timeout=60)


def _params(stack, n: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return stack.engine.wait_arrivals(n)[n - 1]["sampling_params"]


def test_a_new_field_flows_from_the_table(fake_stack, typical) -> None:  # type: ignore[no-untyped-def]
    http = _http(fake_stack)
    before = len(fake_stack.engine.arrivals)
    r = http.post("/v1/chat/completions", json={"messages": Q, "max_tokens": 4, "typical_p": 0.5})
    assert r.status_code == 200, r.text
    assert _params(fake_stack, before + 1)["typical_p"] == 0.5
    r = http.post("/v1/chat/completions", json={"messages": Q, "max_tokens": 4})
    assert r.status_code == 200 and "typical_p" not in _params(fake_stack, before + 2)
    body = {"model": "claude", "max_tokens": 4, "messages": Q, "typical": 0.25}
    r = http.post("/v1/messages", json=body, headers=ANTH)
    assert r.status_code == 200, r.text
    assert _params(fake_stack, before + 3)["typical_p"] == 0.25

    r = http.post("/v1/chat/completions", json={"messages": Q, "typical_p": 0})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "typical_p"
    assert err["message"] == "invalid value for 'typical_p': Input should be greater than 0"
    r = http.post("/v1/messages", json={**body, "typical": 1.5}, headers=ANTH)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "typical: Input should be less than or equal to 1"
    # an API the row does not name refuses it as it refuses any unknown field
    r = http.post("/v1/completions", json={"prompt": "hi", "typical_p": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "typical_p"
    assert len(fake_stack.engine.arrivals) == before + 3


def test_the_trainer_skips_what_the_table_marks_penalized(monkeypatch) -> None:
    """min_p marked ``penalized`` (it is not): a record sampled with it is skipped."""
    rows = [
        dataclasses.replace(f, logprobs="penalized") if f.name == "min_p" else f
        for f in sampling_fields.FIELDS
    ]
    monkeypatch.setattr(sampling_fields, "FIELDS", tuple(rows))
    row = InteractionRow(min_p=0.2, frequency_penalty=0.0, presence_penalty=0.0)
    assert data.never_trained(row) == "penalized"
    assert data.never_trained(InteractionRow(min_p=0.0)) is None
    sql = " ".join(str(clause) for clause in data.trains_on())
    assert "interactions.min_p" in sql and "interactions.frequency_penalty" in sql
