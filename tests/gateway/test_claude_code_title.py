"""Claude Code's session-title request, replayed against the real gateway and engine.

The body in data/claude_code_2.1.197_session_title.json was captured (with a logging
proxy in front of `rlgate up`) from Claude Code 2.1.197 as it titles a session: a
streamed `/v1/messages?beta=true` call with its own short system prompt, no tools,
`thinking: disabled`, `max_tokens: 64000` and `output_config: {"effort": "high",
"format": {"type": "json_schema", "schema": {title: string}}}`. Claude Code parses the
answer as that JSON. The replay adds `temperature: 0` (Claude Code sends none) so the
packaged model's answer is short and the same on every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema

from tests.gateway.helpers import wait_recorded

BODY = json.loads(
    (Path(__file__).parent / "data" / "claude_code_2.1.197_session_title.json").read_text()
)
HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,context-1m-2025-08-07,"
    "interleaved-thinking-2025-05-14,context-management-2025-06-27,effort-2025-11-24,"
    "structured-outputs-2025-12-15",
    "x-claude-code-session-id": "dc49880e-4df1-43fa-aec2-591d3943f242",
}


def _events(lines: list[str]) -> list[tuple[str, dict]]:
    """(event name, data) pairs of an SSE stream."""
    out, name = [], ""
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[len("data: ") :])))
    return out


def test_claude_code_session_title_request_answers_schema_json(stack):
    schema = BODY["output_config"]["format"]["schema"]
    body = {**BODY, "temperature": 0}
    with httpx.stream(
        "POST",
        stack.gw.url + "/v1/messages?beta=true",
        json=body,
        headers={**HEADERS, "Authorization": f"Bearer {stack.key()}"},
        timeout=300,
    ) as r:
        assert r.status_code == 200, r.read().decode()
        events = _events(list(r.iter_lines()))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    msg_id = events[0][1]["message"]["id"]
    text = "".join(
        d["delta"]["text"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "text_delta"
    )
    (delta,) = [d for n, d in events if n == "message_delta"]
    assert delta["delta"]["stop_reason"] == "end_turn", (delta, text)
    answer = json.loads(text)  # what Claude Code parses: JSON under the request's schema
    jsonschema.validate(answer, schema)
    assert answer["title"].strip()

    (rec,) = wait_recorded(stack, [msg_id])
    assert rec.request["output_config"] == BODY["output_config"]
    assert rec.finish_reason == "stop"
    assert len(rec.completion_token_ids) == delta["usage"]["output_tokens"]
