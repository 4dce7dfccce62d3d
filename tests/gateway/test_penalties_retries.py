"""Penalties and client retries through the gateway (real embedded engine, SQLite and
PostgreSQL): penalties are accepted in OpenAI's range, sent to the engine and recorded,
and a penalized sample is never selected for training; an SDK's resend of a request
(``x-stainless-retry-count`` > 0) supersedes the earlier answer, which is not selected
either, while distinct requests and identical ones without the header are left alone."""

from __future__ import annotations

import secrets

import httpx
import openai
import pytest
from sqlalchemy import update

from schemas.tables import InteractionRow
from tests.gateway.helpers import wait_recorded
from trainer.data import select_samples
from trainer.triggers import count_signal

Q = [{"role": "user", "content": "Say hello hello hello hello."}]


def _rate(stack, ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        db.execute(update(InteractionRow).where(InteractionRow.id.in_(ids)).values(reward=1.0))
        db.commit()


def _select(stack, project: str):  # type: ignore[no-untyped-def]
    with stack.factory() as db:
        sel = select_samples(db, project, max_staleness=10, max_samples=100, group_by_prompt=False)
        return sel, count_signal(db, project, 10)


def test_penalties_are_sent_recorded_and_not_trained(stack) -> None:  # type: ignore[no-untyped-def]
    project = f"pen-{secrets.token_hex(3)}"
    client = stack.client(stack.key(project=project))
    plain = client.chat.completions.create(
        model="rlgate-policy", messages=Q, temperature=0, max_tokens=12
    )
    pen = client.chat.completions.create(
        model="rlgate-policy",
        messages=Q,
        temperature=0,
        max_tokens=12,
        frequency_penalty=2.0,
        presence_penalty=0.5,
    )
    resp = client.responses.create(
        model="rlgate-policy",
        input="Say hello.",
        max_output_tokens=8,
        extra_body={"presence_penalty": 1.0},  # not in the Responses SDK: vLLM-style extra
    )
    rec_plain, rec_pen, rec_resp = wait_recorded(stack, [plain.id, pen.id, resp.id])
    assert (rec_plain.frequency_penalty, rec_plain.presence_penalty) == (0.0, 0.0)
    assert (rec_pen.frequency_penalty, rec_pen.presence_penalty) == (2.0, 0.5)
    assert (rec_resp.frequency_penalty, rec_resp.presence_penalty) == (0.0, 1.0)
    # the engine sampled with the penalties: asking it directly with them gives the record
    direct = httpx.post(
        stack.engine.url + "/generate",
        timeout=120,
        json={
            "input_ids": rec_pen.prompt_token_ids,
            "return_logprob": True,
            "sampling_params": {
                "max_new_tokens": 12,
                "temperature": 0,
                "frequency_penalty": 2.0,
                "presence_penalty": 0.5,
            },
        },
    ).json()
    assert rec_pen.completion_token_ids == direct["output_ids"]
    assert rec_pen.completion_logprobs == pytest.approx(
        [t[0] for t in direct["meta_info"]["output_token_logprobs"]], abs=1e-5
    )
    _rate(stack, [plain.id, pen.id, resp.id])
    sel, counted = _select(stack, project)
    assert [s.interaction_id for s in sel.samples] == [plain.id]
    assert sel.skipped["penalized"] == 2 and counted == 1


@pytest.mark.parametrize("name", ["frequency_penalty", "presence_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01])
def test_out_of_range_penalty_is_openai_400(fake_stack, name, value) -> None:  # type: ignore[no-untyped-def]
    """Refused before an engine is asked, on any database: the unit tier's stack."""
    client = fake_stack.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="rlgate-policy", messages=Q, max_tokens=4, **{name: value}
        )
    assert e.value.status_code == 400
    body = e.value.response.json()
    assert body["error"]["type"] == "invalid_request_error" and name in body["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model="rlgate-policy", input="hi", max_output_tokens=4, extra_body={name: value}
        )


def test_sdk_retry_supersedes_the_orphan(stack) -> None:  # type: ignore[no-untyped-def]
    project = f"retry-{secrets.token_hex(3)}"
    client = stack.client(stack.key(project=project))
    session = {"x-session-id": f"s-{secrets.token_hex(4)}"}

    def call(messages, retry: int | None = None) -> str:  # type: ignore[no-untyped-def]
        headers = dict(session)
        if retry is not None:
            headers["x-stainless-retry-count"] = str(retry)
        return client.chat.completions.create(
            model="rlgate-policy",
            messages=messages,
            temperature=0.7,
            max_tokens=6,
            extra_headers=headers,
        ).id

    first = call(Q, retry=0)
    wait_recorded(stack, [first])
    retry = call(Q, retry=1)
    other = call([{"role": "user", "content": "Name a colour."}])
    again = call([{"role": "user", "content": "Name a colour."}])  # no header: a new sample
    recs = wait_recorded(stack, [first, retry, other, again])
    by_id = {r.id: r for r in recs}
    assert by_id[first].superseded_by == retry
    assert by_id[retry].attempt == 1 and by_id[retry].superseded_by is None
    assert by_id[other].superseded_by is None and by_id[again].superseded_by is None
    _rate(stack, [first, retry, other, again])
    sel, counted = _select(stack, project)
    assert sorted(s.interaction_id for s in sel.samples) == sorted([retry, other, again])
    assert sel.skipped["superseded"] == 1 and counted == 3
