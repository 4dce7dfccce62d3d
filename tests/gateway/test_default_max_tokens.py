"""RLGATE_DEFAULT_MAX_TOKENS: the output limit of requests that name none (Codex sends no
max_output_tokens; a 135M policy may then write until its context is full)."""

from __future__ import annotations

import anthropic
import openai

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from tests.gateway.fake_engine import in_process_gateway

STORY = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]


def test_default_max_tokens_caps_only_requests_without_a_limit(sqlite_url, tmp_path, engine):
    upgrade(sqlite_url)
    with transaction(session_factory(make_engine(sqlite_url))) as db:
        _, secret = create_key(db, "cap", "agent")
    with in_process_gateway(tmp_path / "gw", sqlite_url, engine.url, default_max_tokens="5") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, timeout=120)
        r = client.chat.completions.create(model="rlgate-policy", messages=STORY, temperature=0)
        assert r.usage.completion_tokens == 5
        assert r.choices[0].finish_reason == "length"
        # an explicit limit wins, also above the default
        r = client.chat.completions.create(
            model="rlgate-policy", messages=STORY, temperature=0, max_tokens=7
        )
        assert r.usage.completion_tokens == 7
        # the Responses API (Codex's) without max_output_tokens: the gateway's cap ends the
        # turn as completed (Codex treats "incomplete" as an error that ends its session)
        resp = client.responses.create(model="rlgate-policy", input=STORY[0]["content"])
        assert resp.usage.output_tokens == 5
        assert resp.status == "completed" and resp.incomplete_details is None
        # the client's own limit reached is "incomplete", as OpenAI reports it
        resp = client.responses.create(
            model="rlgate-policy", input=STORY[0]["content"], max_output_tokens=6
        )
        assert resp.usage.output_tokens == 6
        assert resp.status == "incomplete"
        assert resp.incomplete_details.reason == "max_output_tokens"
        # Messages: Claude Code asks for max_tokens 32000, more than the context leaves; the
        # gateway drops it, so the cap applies, and the cut is not the client's limit:
        # end_turn (Claude Code fails a turn that ends with max_tokens)
        a = anthropic.Anthropic(base_url=gw.url, api_key=secret, max_retries=0, timeout=120)
        kw = {"model": "claude-sonnet-4-6", "messages": STORY, "extra_body": {"temperature": 0}}
        msg = a.messages.create(max_tokens=32000, **kw)
        assert msg.usage.output_tokens == 5 and msg.stop_reason == "end_turn"
        with a.messages.stream(max_tokens=32000, **kw) as s:
            assert s.get_final_message().stop_reason == "end_turn"
        # its own limit reached is max_tokens
        msg = a.messages.create(max_tokens=6, **kw)
        assert msg.usage.output_tokens == 6 and msg.stop_reason == "max_tokens"
