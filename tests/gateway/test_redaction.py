"""Redaction before storage (gateway/recording/redaction.py).

Unit checks of the redactor and the pattern validation, then the real gateway (embedded
engine, packaged model) on SQLite and PostgreSQL: a project with redaction on stores no
email, phone number or key, marks the record and drops its token data, and the trainer's
selection skips it; a project with redaction off stores the request unchanged.
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy import text, update

from core.db import transaction
from core.keys import create_key
from core.redaction_patterns import RedactionConfigError, check_pattern
from core.settings import Settings, get_settings
from gateway.recording.redaction import MARKER, RedactionPolicy, Redactor
from rlgate.cli import main
from schemas.tables import InteractionRow, ProjectRow
from tests.gateway.helpers import run_in_fresh_loop, wait_recorded
from trainer.data import select_samples
from trainer.triggers import count_signal

EMAIL = "jane.roe@example.org"
PHONE = "+1 415 555 2671"
KEY = "sk-proj-Zx81QqLmN0pRsTuV3wXy"
SECRETS = (EMAIL, PHONE, KEY)
PROMPT = f"My email is {EMAIL}, my phone is {PHONE} and my key is {KEY}. Say hi."


def item(request: dict, output: dict) -> dict:
    return {
        "interaction": {
            "id": "chatcmpl-1",
            "request": request,
            "output": output,
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [4, 5],
            "completion_logprobs": [-0.1, -0.2],
        },
        "session": {"id": "s1", "metadata": {"user": EMAIL}},
    }


def test_redactor_removes_every_kind_and_marks_the_record():
    req = {
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [{"function": {"description": f"mail {EMAIL}"}}],
        "max_tokens": 8,
    }
    out = {
        "text": f"Reach me at {EMAIL} or {PHONE}",
        "tool_calls": [{"id": "c1", "name": "send", "arguments": json.dumps({"key": KEY})}],
    }
    before = item(req, out)
    original = copy.deepcopy(before)
    got = Redactor().record(before)
    assert before == original  # the caller's objects are not changed
    dumped = json.dumps(got)
    for secret in SECRETS:
        assert secret not in dumped
    rec = got["interaction"]
    assert rec["request"]["messages"][0]["content"].startswith("My email is [REDACTED:email]")
    assert rec["request"]["max_tokens"] == 8  # non-strings untouched
    assert rec["request"][MARKER]["redacted"] is True
    assert rec["request"][MARKER]["counts"] == {"email": 4, "phone": 2, "api_key": 2}
    assert rec["prompt_token_ids"] == rec["completion_token_ids"] == []
    assert rec["completion_logprobs"] == []


def test_record_without_matches_is_unchanged():
    plain = item({"messages": [{"role": "user", "content": "2+2?"}]}, {"text": "4"})
    plain["session"] = None
    assert Redactor().record(plain) == plain


@pytest.mark.parametrize(
    ("text_in", "kind"),
    [
        ("Authorization: Bearer abcDEF0123456789xyz.ABC", "bearer_token"),
        ("sha 0123456789abcdef0123456789abcdef", "hex_secret"),
        ("blob QWxhZGRpbjpvcGVuIHNlc2FtZQ9876543210abcdefXYZ==", "base64_secret"),
        ("call (415) 555-2671", "phone"),
        ("key rlg_agent_" + "Ab1_" * 11, "api_key"),
    ],
)
def test_builtin_kinds(text_in, kind):
    from collections import Counter

    counts: Counter[str] = Counter()
    assert f"[REDACTED:{kind}]" in Redactor().text(text_in, counts)
    assert counts[kind] == 1


@pytest.mark.parametrize(
    "harmless",
    ["ip 192.168.100.200", "on 2024-11-30", "3+4=7", "see src/gateway/redaction_module.py"],
)
def test_common_text_is_left_alone(harmless):
    from collections import Counter

    assert Redactor().text(harmless, Counter()) == harmless


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(a+)+$", "quantified group contains another quantifier"),
        ("(?:[a-z0-9]+\\.)+com", "quantified group contains another quantifier"),
        ("(a|aa)*b", "alternation inside an unbounded repeat"),
        ("(\\w+)\\1", "backreferences"),
        ("x?", "matches the empty string"),
        ("[abc", "invalid regex"),
        ("a{5000}", "repeat bound"),
        ("a" * 600, "longer than"),
    ],
)
def test_bad_patterns_are_refused_with_a_reason(pattern, reason):
    with pytest.raises(RedactionConfigError, match=reason):
        check_pattern(pattern)
    with pytest.raises(ValidationError, match=reason):
        Settings(redact_patterns=[pattern])


def test_custom_pattern_and_config_error_in_cli(monkeypatch):
    r = Redactor((check_pattern(r"ACME-\d{6}"),))
    from collections import Counter

    counts: Counter[str] = Counter()
    assert r.text("ticket ACME-123456", counts) == "ticket [REDACTED:custom]"
    monkeypatch.setenv("RLGATE_REDACT_PATTERNS", json.dumps(["(a+)+"]))
    get_settings.cache_clear()
    done = CliRunner().invoke(main, ["config"])
    assert done.exit_code == 2
    assert "redaction pattern '(a+)+'" in done.output and "Traceback" not in done.output


def test_bad_project_patterns_fail_closed():
    policy = RedactionPolicy(None)
    red = policy._build({"redaction": {"enabled": True, "patterns": ["(a+)+"]}})
    assert red is not None and "quantifier" in (red.config_error or "")
    got = red.record(item({"messages": [{"role": "user", "content": "hi"}]}, {"text": "yo"}))
    rec = got["interaction"]
    assert rec["request"][MARKER]["config_error"] and rec["completion_token_ids"] == []
    assert policy._build({"redaction": {"enabled": False}}) is None
    assert RedactionPolicy(None, enabled=True)._build(None) is not None


def test_deployment_setting_redacts_every_project():
    items = [item({"messages": [{"role": "user", "content": PROMPT}]}, {"text": "ok"})]
    on = run_in_fresh_loop(RedactionPolicy(None, enabled=True, patterns=["hi"]).apply("p", items))
    assert not any(secret in json.dumps(on) for secret in SECRETS)
    assert on[0]["interaction"]["request"][MARKER]["counts"]["custom"] == 1
    off = run_in_fresh_loop(RedactionPolicy(None).apply("p", items))
    assert off == items


def test_client_cannot_send_the_marker():
    spoof = item({"messages": [], MARKER: {"redacted": True, "purged_at": "x"}}, {})
    got = run_in_fresh_loop(RedactionPolicy(None).apply("p", [spoof]))
    assert MARKER not in got[0]["interaction"]["request"]


# ---- through the real gateway, SQLite and PostgreSQL ---------------------------------


def _project(stack, project: str, redaction: bool) -> str:
    with transaction(stack.factory) as db:
        _, secret = create_key(db, project, "agent")
        row = db.get(ProjectRow, project)
        row.settings = {"redaction": {"enabled": True}} if redaction else {}
    return secret


def _raw_text(stack, rid: str) -> str:
    """The stored request and output as the database holds them (JSON text)."""
    with stack.factory() as db:
        cast = "::text" if db.get_bind().dialect.name == "postgresql" else ""
        row = db.execute(
            text(f"SELECT request{cast}, output{cast} FROM interactions WHERE id = :i"),
            {"i": rid},
        ).one()
    return f"{row[0]} {row[1]}"


def test_gateway_redacts_before_storage_and_trainer_skips(stack):
    suffix = stack.db_url.rsplit("/", 1)[-1][-6:]
    on, off = f"red-on-{suffix}", f"red-off-{suffix}"
    msgs = [{"role": "user", "content": PROMPT}]
    ids = {}
    for project, redact in ((on, True), (off, False)):
        client = stack.client(_project(stack, project, redact))
        resp = client.chat.completions.create(
            model="rlgate-policy", messages=msgs, temperature=0, max_tokens=8
        )
        ids[project] = resp.id
    chunks = stack.client(_project(stack, on, True)).chat.completions.create(
        model="rlgate-policy", messages=msgs, temperature=0, max_tokens=4, stream=True
    )
    stream_id = next(iter(chunks)).id
    for _ in chunks:
        pass
    red, plain, streamed = wait_recorded(stack, [ids[on], ids[off], stream_id])

    for rec, rid in ((red, ids[on]), (streamed, stream_id)):
        raw = _raw_text(stack, rid)
        for secret in SECRETS:
            assert secret not in raw
            assert secret not in json.dumps(rec.output.model_dump())
        assert "[REDACTED:email]" in raw and "[REDACTED:api_key]" in raw
        marker = rec.request[MARKER]
        assert marker["redacted"] is True
        assert marker["counts"]["email"] >= 1 and marker["counts"]["phone"] >= 1
        assert marker["counts"]["api_key"] >= 1
        assert rec.prompt_token_ids == rec.completion_token_ids == []
        assert rec.usage.prompt_tokens > 0  # counts survive, content does not

    assert plain.request["messages"] == msgs and MARKER not in plain.request
    assert plain.prompt_token_ids and plain.completion_token_ids
    for secret in SECRETS:
        assert secret in _raw_text(stack, ids[off])
    for path in (stack.data_dir / "spool").glob("*.jsonl"):  # what the spool still holds
        for line in path.read_text().splitlines():
            if ids[on] in line or stream_id in line:
                assert not any(secret in line for secret in SECRETS)

    with transaction(stack.factory) as db:
        db.execute(
            update(InteractionRow)
            .where(InteractionRow.id.in_([ids[on], ids[off], stream_id]))
            .values(reward=1.0)
        )
    with stack.factory() as db:
        assert count_signal(db, on, 10) == 0
        assert (
            select_samples(db, on, max_staleness=10, max_samples=10, group_by_prompt=False).samples
            == []
        )
        assert count_signal(db, off, 10) == 1
        sel = select_samples(db, off, max_staleness=10, max_samples=10, group_by_prompt=False)
        assert [s.interaction_id for s in sel.samples] == [ids[off]]
