"""Issue 26's security matrix: for every setting an admin route writes and every key kind,
no key can make rlgate run a program, call an address, spend or read a credential, or
change another project. Only the operator's configuration grants those
(core/grants.py, docs/security.md).

A real gateway on PostgreSQL (no engine is needed for settings), with the operator's
entries in its configuration, and one key of every kind. Every refused write changes
nothing (settings and audit log compared before and after). The last test runs a real
``rlgate worker`` on specs stored before operator grants existed (the way findings 1, 2
and 5 were exploited) and shows it runs none of them.

Issue 36's rows: a session's key opens no session and ends with its session (finding 3);
no client writes a system rating source or takes the worker's idempotency keys, and a
project may refuse ratings from its agent keys (finding 4); every caller's request is
bounded before any engine is asked: custom-tool grammars (findings 1 and 5) and the
Completions prompt forms and choices. tests/security/test_shared_stack.py shows the
medium findings live, with the real engine and worker.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from core.db import make_engine, session_factory, transaction
from core.keys import create_key, ensure_project
from core.migrate import upgrade
from core.settings import get_settings
from gateway.api.openai_chat.protocol import MAX_N
from gateway.api.openai_completions.protocol import MAX_PROMPTS
from schemas.atdp import FeedbackSource
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import AuditEventRow, FeedbackRow, InteractionRow, ProjectRow, SessionRow
from tests.gateway.fake_engine import in_process_gateway
from tests.grammar_bombs import BOMBS, TOO_DEEP, custom_tool_body
from tests.rows import interaction, session
from tests.security.listener import Listener
from tests.servers import REPO, free_port
from trainer.hooks import on_session_closed

pytestmark = pytest.mark.timeout(300)

BOOTSTRAP = "rlg_bootstrap_" + secrets.token_urlsafe(12)
COMMANDS = {"ok": {"command": "true"}, "p2_only": {"command": "true", "projects": ["p2"]}}
JUDGES = {"mini": {"model": "openai/mini"}, "p2_judge": {"model": "openai/x", "projects": ["p2"]}}
GOOD_VERIFIERS = [{"name": "command", "use": "ok"}, {"name": "judge", "judge": "mini"}]

# what a project admin might send to make rlgate run, call or spend something
VERIFIER_ATTACKS: dict[str, Any] = {  # the first nine were accepted before (issue 26)
    "a shell command": {"name": "command", "command": "id > /tmp/pwned"},
    "an argv program": {"name": "command", "command": ["/bin/sh", "-c", "id"]},
    "a cwd and env": {"name": "command", "command": "true", "cwd": "/", "env": {"LD_PRELOAD": "x"}},
    "a longer command timeout": {"name": "command", "command": "true", "timeout_s": 3600},
    "a judge URL (SSRF)": {"name": "judge", "model": "openai/x", "api_base": "http://127.0.0.1:1/v1?"},
    "a key variable": {"name": "judge", "model": "openai/x", "api_base": "http://127.0.0.1:1/v1",
                       "api_key_env": "RLGATE_JUDGE_OPENAI"},
    "a provider (its credential)": {"name": "judge", "model": "anthropic/claude-x"},
    "the judge caps": {"name": "judge", "model": "openai/x", "timeout_s": 600, "retries": 5,
                       "calls_per_hour": 100000, "usd_per_hour": 1e4},
    "caps over an entry": {"name": "judge", "judge": "mini", "seconds_per_hour": 1e6},
    "another project's command": {"name": "command", "use": "p2_only"},
    "an unknown command entry": {"name": "command", "use": "rm"},
    "another project's judge": {"name": "judge", "judge": "p2_judge"},
    "a module to import": {"name": "os:system"},
}  # fmt: skip
PROMPTS = [{"prompt": "2+2?", "expected": "4"}]
TRAINING_ATTACKS: dict[str, Any] = {
    "a gate verifier module": {"eval_gate": {"enabled": True, "verifier": "pydoc:pipepager",
                                             "prompts": PROMPTS}},
    "a gate command": {"eval_gate": {"enabled": True, "verifier": "command", "command": "id",
                                     "prompts": PROMPTS}},
    "a model path": {"model_path": "/etc"},
    "an engine URL": {"engine_url": "http://127.0.0.1:1"},
    "an adapter dir": {"adapter_dir": "/tmp"},
    # the operator's observability and scale settings (RLGATE_*), never a project's
    "a tracker": {"trackers": "mlflow"},
    "a tracking server": {"mlflow_tracking_uri": "http://127.0.0.1:1"},
    "a W&B entity": {"wandb_entity": "someone-else", "wandb_mode": "online"},
    "an OTLP endpoint": {"otlp_endpoint": "http://127.0.0.1:1/v1/traces"},
    "captured content": {"otlp_capture_content": True},
    "a public URL": {"public_url": "http://evil.example"},
    "training processes": {"train_processes": 64, "train_backend": "nccl"},
    "engines to pause": {"train_shared_gpu_engines": "http://127.0.0.1:1"},
}  # fmt: skip


@dataclass
class Stack:
    url: str
    factory: Any
    keys: dict[str, str | None]  # key kind -> secret


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.conftest import PG_BASE, _admin_conn

    name = f"rlgate_test_{secrets.token_hex(6)}"
    with _admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_BASE}/{name}"
    upgrade(url)
    engine = make_engine(url)
    factory = session_factory(engine)
    with transaction(factory) as db:
        ensure_project(db, "p1").settings = {"verifiers": ["exact_number"]}
        ensure_project(db, "p2").settings = {"verifiers": ["contains"]}
        db.flush()
        keys: dict[str, str | None] = {"bootstrap admin": BOOTSTRAP, "no key": None}
        for kind in ("admin", "agent", "feedback"):
            keys[f"project {kind}"] = create_key(db, "p1", kind)[1]
    grants = {"commands": json.dumps(COMMANDS), "judges": json.dumps(JUDGES)}
    tmp = tmp_path_factory.mktemp("matrix")
    try:
        with in_process_gateway(  # its answers are under test, not its process
            tmp / "gw", url, f"http://127.0.0.1:{free_port()}", admin_key=BOOTSTRAP, **grants
        ) as gw:
            r = httpx.post(
                gw.url + "/v1/sessions",
                headers={"Authorization": f"Bearer {keys['project agent']}"},
                json={},
                timeout=30,
            )
            assert r.status_code == 201, r.text
            keys["per-session"] = r.json()["api_key"]
            yield Stack(gw.url, factory, keys)
    finally:
        engine.dispose()
        with _admin_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _state(stack: Stack) -> tuple[Any, ...]:
    with stack.factory() as db:
        settings = {p.id: p.settings for p in db.scalars(select(ProjectRow)).all()}
        audits = db.scalar(select(func.count()).select_from(AuditEventRow))
    return settings, audits


def _call(stack: Stack, kind: str, method: str, path: str, body: Any) -> httpx.Response:
    key = stack.keys[kind]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, stack.url + path, headers=headers, json=body, timeout=30)


ADMINS = ("bootstrap admin", "project admin")
OTHERS = ("project agent", "project feedback", "per-session", "no key")


@pytest.mark.parametrize("kind", ADMINS + OTHERS)
@pytest.mark.parametrize("attack", list(VERIFIER_ATTACKS))
def test_no_key_can_grant_a_program_an_address_or_a_credential(
    stack: Stack, kind: str, attack: str
) -> None:
    before = _state(stack)
    body = {"verifiers": [VERIFIER_ATTACKS[attack]]}
    r = _call(stack, kind, "PUT", "/admin/api/projects/p1/verifiers", body)
    if kind in ADMINS:
        assert r.status_code == 400, r.text
        assert "verifiers not changed" in r.json()["error"]["message"]
    else:
        assert r.status_code in (401, 403), r.text
    assert _state(stack) == before


@pytest.mark.parametrize("kind", ADMINS)
@pytest.mark.parametrize("attack", list(TRAINING_ATTACKS))
def test_training_settings_name_no_code_path_or_address(
    stack: Stack, kind: str, attack: str
) -> None:
    before = _state(stack)
    r = _call(stack, kind, "PATCH", "/admin/api/projects/p1/training", TRAINING_ATTACKS[attack])
    assert r.status_code == 400, r.text
    assert _state(stack) == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/admin/api/projects/p2/verifiers", {"verifiers": GOOD_VERIFIERS}),
        ("PATCH", "/admin/api/projects/p2/training", {"epochs": 2}),
        ("POST", "/admin/api/actions/pause", {"project_id": "p2"}),
        ("POST", "/admin/api/actions/train-now", {"project_id": "p2"}),
        ("POST", "/admin/api/keys", {"project_id": "p2", "kind": "admin"}),
        ("GET", "/admin/api/projects/p2/verifiers", None),
    ],
)
def test_a_project_admin_cannot_touch_another_project(
    stack: Stack, method: str, path: str, body: Any
) -> None:
    before = _state(stack)
    r = _call(stack, "project admin", method, path, body)
    assert r.status_code in (403, 404), r.text
    assert _state(stack) == before


def test_what_admins_may_set_and_what_they_see(stack: Stack) -> None:
    """The operator's entries by name work; reading them back shows no operator secret."""
    r = _call(stack, "project admin", "PUT", "/admin/api/projects/p1/verifiers",
              {"verifiers": GOOD_VERIFIERS})  # fmt: skip
    assert r.status_code == 200, r.text
    shown = json.dumps(_call(stack, "project admin", "GET", "/admin/api/projects/p1/verifiers",
                             None).json())  # fmt: skip
    assert "api_key_env" not in shown and "RLGATE_" not in shown
    # the bootstrap admin reaches p2, but only with p2's own grants
    r = _call(stack, "bootstrap admin", "PUT", "/admin/api/projects/p2/verifiers",
              {"verifiers": [{"name": "command", "use": "p2_only"}]})  # fmt: skip
    assert r.status_code == 200, r.text


def test_session_metadata_cannot_choose_or_configure_a_verifier_program(stack: Stack) -> None:
    """An agent key writes session metadata: it may name a verifier, never what it runs."""
    from trainer.verifiers import configured_verifiers

    evil = {"name": "judge", "judge": "mini", "api_base": "http://evil/v1"}
    meta = {"verifiers": [{"name": "command", "use": "ok"}, evil]}
    r = _call(stack, "project agent", "POST", "/v1/sessions", {"metadata": meta})
    assert r.status_code == 201, r.text
    assert configured_verifiers({}, r.json().get("metadata") or meta) == []


# ---- issue 36, finding 3: a session key ends with its session ---------------------------


@pytest.mark.parametrize(
    ("path", "said"),
    [("/v1/sessions", "cannot open sessions"), ("/rl/start_session", "start_session needs")],
)
def test_a_per_session_key_opens_no_session(stack: Stack, path: str, said: str) -> None:
    before = _state(stack)
    r = _call(stack, "per-session", "POST", path, {})
    assert r.status_code == 403, r.text
    assert said in r.json()["error"]["message"]
    assert _state(stack) == before
    assert _call(stack, "project agent", "POST", path, {}).status_code in (200, 201)


def test_a_chain_below_an_ended_session_stops(stack: Stack) -> None:
    """Older data: session A's key minted C's, C's minted D's. Once A has ended (past the
    grace), C's and D's keys get 401 too, though their own sessions are open."""
    from datetime import timedelta

    from core.keys import find_key

    with transaction(stack.factory) as db:
        for sid in ("chain_a", "chain_c", "chain_d"):
            db.add(to_row(session(sid, "p1")))
        db.flush()
        agent = find_key(db, stack.keys["project agent"] or "")
        assert agent is not None
        a, a_key = create_key(db, "p1", "agent", session_id="chain_a", parent_key_id=agent.id)
        c, c_key = create_key(db, "p1", "agent", session_id="chain_c", parent_key_id=a.id)
        _, d_key = create_key(db, "p1", "agent", session_id="chain_d", parent_key_id=c.id)

    def status(key: str, sid: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{stack.url}/v1/sessions/{sid}", headers=headers, timeout=30).status_code

    assert [status(a_key, "chain_a"), status(c_key, "chain_c"), status(d_key, "chain_d")] == [
        200, 200, 200
    ]  # fmt: skip
    with transaction(stack.factory) as db:
        row = db.get(SessionRow, "chain_a")
        row.status = "closed"
        row.closed_at = utcnow() - timedelta(hours=2)  # past RLGATE_SESSION_KEY_GRACE_S
    deadline = time.monotonic() + 20  # the gateway's key cache forgets within seconds
    while (got := [status(k, s) for k, s in ((a_key, "chain_a"), (c_key, "chain_c"),
                                               (d_key, "chain_d"))]) != [401] * 3:  # fmt: skip
        assert time.monotonic() < deadline, got
        time.sleep(0.3)


# ---- issue 36, finding 4: ratings only from those entitled to give them -----------------

RATERS = ("bootstrap admin", "project admin", "project agent", "project feedback")
SYSTEM_SOURCES = [s.value for s in FeedbackSource if s.value != "user"]


def _rated_session(stack: Stack, sid: str) -> None:
    with transaction(stack.factory) as db:
        if db.get(SessionRow, sid) is None:
            db.add(to_row(session(sid, "p1")))


def _ratings(stack: Stack, sid: str) -> list[tuple[str, str | None]]:
    with stack.factory() as db:
        rows = db.scalars(select(FeedbackRow).where(FeedbackRow.session_id == sid)).all()
        return sorted((r.source, r.idempotency_key) for r in rows)


@pytest.mark.parametrize("kind", RATERS)
@pytest.mark.parametrize("source", SYSTEM_SOURCES)
def test_no_client_writes_a_system_source(stack: Stack, kind: str, source: str) -> None:
    _rated_session(stack, "fb_sys")
    body = {"session_id": "fb_sys", "value": 1, "source": source, "rater": "contains"}
    r = _call(stack, kind, "POST", "/feedback", body)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["param"] == "source" and "user" in r.json()["error"]["message"]
    assert _ratings(stack, "fb_sys") == []


@pytest.mark.parametrize("kind", RATERS)
def test_a_client_key_cannot_take_the_workers_idempotency_key(stack: Stack, kind: str) -> None:
    """The forged rating lands as the client's own (source user, its own namespace); the
    verifier's later rating with ``verifier:<name>:<session>`` is stored, not dropped."""
    from core.feedback import FeedbackInput, Scope, store_feedback

    sid = "fb_key_" + kind.replace(" ", "_")
    _rated_session(stack, sid)
    key = f"verifier:contains:{sid}"
    body = {"session_id": sid, "value": 1, "idempotency_key": key}
    r = _call(stack, kind, "POST", "/feedback", body)
    assert r.status_code == 200, r.text
    assert (r.json()["source"], r.json()["idempotency_key"]) == ("user", key)
    verdict = FeedbackInput("session", sid, -1.0, "scalar", -1.0, 1.0, -1.0, source="verifier",
                            rater="contains", idempotency_key=key)  # fmt: skip
    _, replayed = store_feedback(stack.factory, verdict, Scope("p1"), wait_s=0)
    assert replayed is False
    assert _ratings(stack, sid) == [("user", "client:" + key), ("verifier", key)]


def test_a_project_can_refuse_ratings_from_its_agent_keys(stack: Stack) -> None:
    _rated_session(stack, "fb_agents")
    url = "/admin/api/projects/p1/feedback"
    assert _call(stack, "project agent", "PUT", url, {"agent_keys_rate": False}).status_code in (
        401, 403
    )  # fmt: skip
    assert _call(stack, "project admin", "GET", url, None).json()["agent_keys_rate"] is True
    r = _call(stack, "project admin", "PUT", url, {"agent_keys_rate": "no"})
    assert r.status_code == 400, r.text
    r = _call(stack, "project admin", "PUT", url, {"agent_keys_rate": False})
    assert r.status_code == 200 and r.json()["agent_keys_rate"] is False, r.text
    try:
        body = {"session_id": "fb_agents", "value": 1}
        for kind in ("project agent", "per-session"):
            r = _call(stack, kind, "POST", "/feedback", body)
            assert r.status_code == 403, r.text
            assert "feedback key" in r.json()["error"]["message"]
        for kind in ("project feedback", "project admin", "bootstrap admin"):
            r = _call(stack, kind, "POST", "/feedback", {**body, "idempotency_key": kind})
            assert r.status_code == 200, (kind, r.text)
        assert len(_ratings(stack, "fb_agents")) == 3
    finally:
        r = _call(stack, "project admin", "PUT", url, {"agent_keys_rate": True})
        assert r.status_code == 200, r.text
    assert _call(stack, "project agent", "POST", "/feedback", body).status_code == 200


# ---- issue 36, findings 1, 5 and 7: bounded work per request --------------------------

CALLERS = ("project agent", "per-session")
# a Completions body's prompt forms -> (the field the 400 names, what its message says)
COMPLETIONS_FORMS: dict[str, tuple[Any, str, str]] = {
    "17 prompts": (["hi"] * 17, "prompt", f"at most {MAX_PROMPTS}"),
    "17 token-id prompts": ([[1, 2]] * 17, "prompt", f"at most {MAX_PROMPTS}"),
    "strings and ids mixed": (["hi", [1, 2]], "prompt", "not a mix"),
    "an empty list": ([], "prompt", "a list of token ids"),
    "a negative token id": ([[1, -1]], "prompt", "outside this model's vocabulary"),
    "a token id past the vocabulary": ([10**9], "prompt", "outside this model's vocabulary"),
    "a number": (7, "prompt", "a list of token-id lists"),
}


def _interactions(stack: Stack) -> int:
    with stack.factory() as db:
        return int(db.scalar(select(func.count()).select_from(InteractionRow)) or 0)


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "offered"])
@pytest.mark.parametrize("kind", CALLERS)
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_custom_tools_grammar_is_bounded(
    stack: Stack, kind: str, bomb: str, forced: bool
) -> None:
    """A nesting bomb or a deep nest in a Responses custom tool is a 400 naming the field
    and the limit (core/ebnf_budget.py), before any engine is asked; an offered tool's
    grammar is only read, so an offered bomb (no deep nest) passes that check."""
    syntax, definition, limit = BOMBS[bomb]
    before = _interactions(stack)
    r = _call(stack, kind, "POST", "/v1/responses", custom_tool_body(syntax, definition, forced))
    if forced or limit == TOO_DEEP:
        assert r.status_code == 400, r.text[:500]
        err = r.json()["error"]
        assert err["param"] == "tools[0].format.definition" and limit in err["message"], err
    else:  # read, then on to the engine (none in this stack): never a 400 or a 500
        assert r.status_code in (200, 502, 503), r.text[:500]
    assert _interactions(stack) == before


@pytest.mark.parametrize("kind", CALLERS)
@pytest.mark.parametrize("form", list(COMPLETIONS_FORMS))
def test_a_completions_prompt_is_bounded(stack: Stack, kind: str, form: str) -> None:
    prompt, param, said = COMPLETIONS_FORMS[form]
    before = _interactions(stack)
    r = _call(stack, kind, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == param and said in err["message"], err
    assert _interactions(stack) == before


@pytest.mark.parametrize("kind", CALLERS)
def test_choices_per_call_are_bounded(stack: Stack, kind: str) -> None:
    body = {"prompt": "hi", "max_tokens": 1, "n": MAX_N + 1}
    r = _call(stack, kind, "POST", "/v1/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text[:500]


# ---- what a real worker does with specs stored before the change -----------------------


@pytest.mark.slow
def test_a_real_worker_runs_no_stored_program_url_or_key(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = Listener(lambda _seen: (500, None)).start()
    pwned = tmp_path / "pwned"
    upgrade(pg_url)
    engine = make_engine(pg_url)
    factory = session_factory(engine)
    broker = f"redis://127.0.0.1:6379/{os.environ.get('RLGATE_TEST_MATRIX_REDIS_DB', '13')}"
    secret = "sk-OPERATOR-judge-" + secrets.token_hex(4)
    env = {"RLGATE_DATABASE_URL": pg_url, "RLGATE_BROKER_URL": broker,
           "RLGATE_JUDGE_OPENAI": secret, "RLGATE_VERIFY_WORKERS": "1"}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    legacy = [  # the specs of findings 1, 2 and 5, as the old admin API stored them
        {"name": "command", "command": f"id > {pwned}; env >> {pwned}"},
        {"name": "judge", "model": "openai/x", "api_base": listener.url + "/v1?",
         "api_key_env": "RLGATE_JUDGE_OPENAI"},
        {"name": "contains"},  # still valid: shows the worker ran this session's task
    ]  # fmt: skip
    with transaction(factory) as db:
        ensure_project(db, "p1").settings = {"verifiers": legacy}
        db.add(to_row(session("s1", "p1", status="closed", closed_at=utcnow(),
                              metadata={"expected": "42"})))  # fmt: skip
        db.flush()
        db.add(to_row(interaction("s1-0", "s1", 0, "42")))
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rlgate.cli", "worker", "-n", f"mx-{secrets.token_hex(3)}@%h"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                           "RLGATE_DATA_DIR": str(tmp_path / "w")},
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        assert on_session_closed(factory, "s1") is True
        deadline = time.monotonic() + 120
        fb: list[FeedbackRow] = []
        while not fb and time.monotonic() < deadline:
            with factory() as db:
                fb = list(db.scalars(select(FeedbackRow)).all())
            time.sleep(0.5)
        assert [(f.rater, f.reward) for f in fb] == [("contains", 1.0)], log.read_text()[-3000:]
        time.sleep(2)  # anything else the task would have done is done
        assert not pwned.exists()
        assert listener.seen == []
        assert "verifier not run" in log.read_text()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        listener.close()
        engine.dispose()
