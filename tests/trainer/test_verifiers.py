"""Verifiers: the built-ins, the selection rules, and a real Celery worker (Redis broker)
rating closed sessions with no request from the client."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from core.keys import ensure_project
from schemas.convert import to_row
from schemas.tables import FeedbackRow, InteractionRow, SessionRow
from tests.grants import grant
from tests.rows import interaction, session
from trainer.hooks import VERIFY_QUEUE, on_session_closed
from trainer.verifiers import (
    VerifierContext,
    command,
    configured_verifiers,
    exact_number,
    get_verifier,
    last_number,
)

REPO = Path(__file__).resolve().parents[2]
REDIS_DB = os.environ.get("RLGATE_TEST_REDIS_DB", "14")
HAS_42 = 'case "$RLGATE_ANSWER" in *42*) exit 0;; esac; exit 1'


def _ctx(text_meta=None, **config):  # type: ignore[no-untyped-def]
    return VerifierContext(session("s", task_id="t", metadata=text_meta or {}), [], config)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 42.", 42.0),
        ("1,234 apples, then 5", 5.0),
        ("total: 1,234", 1234.0),
        ("-3.5 degrees", -3.5),
        ("x = 2e3", 2000.0),
        ("no digits", None),
        (None, None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_exact_number():
    right = interaction("a", "s", 0, "so 6*7 = 42")
    wrong = interaction("b", "s", 0, "I think 41")
    none = interaction("c", "s", 0, "no idea")
    assert exact_number(_ctx({"expected": 42}), right) == 1.0
    assert exact_number(_ctx({"expected": "42"}), wrong) == -1.0
    assert exact_number(_ctx({"expected": 42}), none) == -1.0
    assert exact_number(_ctx({"task": {"expected": "1,234"}}), interaction("d", "s", 0, "1234"))
    assert exact_number(_ctx({}, expected=41), wrong) == 1.0  # verifier params first
    assert exact_number(_ctx({}), right) is None  # nothing expected: abstain


def test_command_runs_the_operators_entry_with_its_exit_status_and_timeout(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    (tmp_path / "flag").write_text("x")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker-secret")
    grant(
        monkeypatch,
        commands={
            "hello": {"command": 'test "$RLGATE_ANSWER" = hello'},
            "fails": {"command": "exit 3"},
            "flag": {"command": ["test", "-f", "flag"], "cwd": str(tmp_path)},
            "slow": {"command": "sleep 30", "timeout_s": 0.5},
            # the worker's secrets never reach a command; its entry's env does
            "no_secret": {"command": 'test -z "$OPENAI_API_KEY" && test "$MODE" = ci',
                          "env": {"MODE": "ci"}},
            "elsewhere": {"command": "true", "projects": ["p2"]},
        },
    )  # fmt: skip
    ans = interaction("a", "s", 0, "hello")
    assert command(_ctx({}, use="hello"), ans) == 1.0
    assert command(_ctx({}, use="fails"), ans) == -1.0
    assert command(_ctx({}, use="flag"), ans) == 1.0
    started = time.monotonic()
    assert command(_ctx({}, use="slow"), ans) == -1.0
    assert time.monotonic() - started < 10
    assert command(_ctx({}, use="no_secret"), ans) == 1.0
    assert command(_ctx({}, use="elsewhere"), ans) is None  # not granted to p1
    assert command(_ctx({}, use="gone"), ans) is None  # no such entry (any more)
    assert command(_ctx({}), ans) is None  # no entry named


def test_selection_rules(monkeypatch):  # type: ignore[no-untyped-def]
    grant(monkeypatch, commands={"make": {"command": "make test", "cwd": "/srv"}})
    project = {"verifiers": [{"name": "command", "use": "make"}]}
    assert configured_verifiers(project, {}) == project["verifiers"]
    assert configured_verifiers({}, {"verifier": "exact_number"}) == [{"name": "exact_number"}]
    # session metadata names the verifier; which command runs comes from the project only
    # (a session spec without the project's is refused, never run)
    assert configured_verifiers({}, {"verifier": {"name": "command", "command": "id"}}) == []
    assert configured_verifiers({}, {"verifier": {"name": "command", "use": "make"}}) == []
    spec = configured_verifiers(project, {"verifiers": [{"name": "command", "use": "other"}]})
    assert spec == [{"name": "command", "use": "make"}]
    assert configured_verifiers({}, {}) == []
    assert get_verifier("exact_number") is exact_number
    assert get_verifier("no-such-verifier") is None


@pytest.fixture
def worker(db_url, migrated_db, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A real `celery worker` process (the trainer's queue and the verify queue) on a
    Redis broker and the test's database, with the operator's command entry."""
    from core.settings import get_settings

    grants = grant(monkeypatch, commands={"has42": {"command": HAS_42}})

    broker = f"redis://127.0.0.1:6379/{REDIS_DB}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RLGATE_DATABASE_URL": db_url,
        "RLGATE_BROKER_URL": broker,
        "RLGATE_DATA_DIR": str(tmp_path / "worker-data"),
        **grants,
    }
    monkeypatch.setenv("RLGATE_DATABASE_URL", db_url)
    monkeypatch.setenv("RLGATE_BROKER_URL", broker)
    get_settings.cache_clear()
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "trainer.celery_app", "worker",
             "--pool=solo", "--loglevel=info", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-Q", f"celery,{VERIFY_QUEUE}",
             "-n", f"verifier-test-{secrets.token_hex(3)}@%h"],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield migrated_db, log
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_closed_sessions_get_verifier_feedback_from_a_real_worker(worker):
    factory, log = worker
    tag = secrets.token_hex(4)
    right, wrong, grp, cmd = (f"{n}-{tag}" for n in ("right", "wrong", "group", "cmd"))
    with factory() as db, db.begin():
        ensure_project(db, "p1")
        ensure_project(db, "p2").settings = {
            "verifiers": [{"name": "command", "use": "has42"}],
            "credit_assignment": {"gamma": 0.5},
        }
        for sid, expected in ((right, 42), (wrong, 7), (grp, 42)):
            meta = {"verifier": "exact_number", "expected": expected}
            db.add(to_row(session(sid, task_id="t", metadata=meta)))
        db.add(to_row(session(cmd, "p2", task_id="t")))
        db.flush()
        db.add(to_row(interaction(f"{right}-0", right, 0, "Let me think: 40")))
        db.add(to_row(interaction(f"{right}-1", right, 1, "The answer is 42.")))
        db.add(to_row(interaction(f"{wrong}-0", wrong, 0, "It is 8")))
        for c, text in enumerate(["42", "41"]):
            db.add(to_row(interaction(f"{grp}.{c}", grp, c, text, group_id=grp, choice_index=c)))
        db.add(to_row(interaction(f"{cmd}-0", cmd, 0, "hmm", project_id="p2")))
        db.add(to_row(interaction(f"{cmd}-1", cmd, 1, "it is 42", project_id="p2")))
    # the gateway's end / expiry paths close the session, then call the hook
    for sid in (right, wrong, grp, cmd):
        with factory() as db, db.begin():
            db.get(SessionRow, sid).status = "closed"
        assert on_session_closed(factory, sid) is True

    deadline = time.monotonic() + 90
    while True:
        with factory() as db:
            fb = db.scalars(select(FeedbackRow).where(FeedbackRow.source == "verifier")).all()
        if len(fb) >= 5 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(fb) == 5, log.read_text()[-3000:]
    got = {(f.target_type, f.target_id): (f.reward, f.rater) for f in fb}
    assert got == {
        ("session", right): (1.0, "exact_number"),
        ("session", wrong): (-1.0, "exact_number"),
        ("interaction", f"{grp}.0"): (1.0, "exact_number"),
        ("interaction", f"{grp}.1"): (-1.0, "exact_number"),
        ("session", cmd): (1.0, "command"),
    }
    with factory() as db:
        rewards = dict(db.execute(select(InteractionRow.id, InteractionRow.reward)).all())
    assert rewards[f"{right}-0"] == rewards[f"{right}-1"] == 1.0  # gamma 1.0 (p1 default)
    assert rewards[f"{wrong}-0"] == -1.0
    assert (rewards[f"{grp}.0"], rewards[f"{grp}.1"]) == (1.0, -1.0)
    assert (rewards[f"{cmd}-0"], rewards[f"{cmd}-1"]) == (0.5, 1.0)  # gamma 0.5 (p2)

    # no verifier configured: nothing is enqueued
    plain = f"plain-{tag}"
    with factory() as db, db.begin():
        db.add(to_row(session(plain, task_id="t")))
    assert on_session_closed(factory, plain) is False
