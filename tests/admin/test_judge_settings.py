"""PUT /admin/api/projects/<p>/verifiers on the real gateway app, served in-process
(SQLite and PostgreSQL): a bad judge configuration (unknown mode, missing model, a rubric
that is not a string, unknown keys) is a 400 whose message says what to fix, and nothing changes; a
good one is stored and GET shows the judge's budget and usage.

No engine is needed for settings, so the gateway points at a closed port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.db import make_engine, session_factory, transaction
from core.keys import create_key
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import AuditEventRow, FeedbackRow, JudgeCallRow, ProjectRow, SessionRow
from tests.gateway.fake_engine import in_process_gateway
from tests.rows import interaction
from tests.servers import free_port

URL = "/admin/api/projects/p1/verifiers"
JUDGE = {"name": "judge", "judge": "mini", "mode": "group", "rubric": "Be right."}
# the operator's entry, in the gateway's configuration
MINI = {"model": "openai/gpt-4o-mini", "calls_per_hour": 30, "usd_per_hour": 0.5}
JUDGES = json.dumps({"mini": {**MINI, "projects": ["p1"]}, "p2s": {"model": "openai/x",
                     "projects": ["p2"]}})  # fmt: skip


@pytest.fixture
def admin(db_url: str, tmp_path: Path) -> Iterator[tuple[httpx.Client, Any, str]]:
    """A client holding p1's project admin key, the session factory, and an agent key."""
    upgrade(db_url)
    engine = make_engine(db_url)
    factory = session_factory(engine)
    before = {"other": 1, "verifiers": ["exact_number"]}
    with transaction(factory) as db:
        db.add(ProjectRow(id="p1", name="p1", created_at=utcnow(), settings=before))
        db.add(ProjectRow(id="p2", name="p2", created_at=utcnow()))
        db.flush()
        _, key = create_key(db, "p1", "admin", name="project admin")
        _, agent = create_key(db, "p1", "agent", name="agent")
    closed_engine = f"http://127.0.0.1:{free_port()}"
    try:
        with (
            in_process_gateway(tmp_path / "gw", db_url, closed_engine, judges=JUDGES) as gw,
            httpx.Client(
                base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as client,
        ):
            yield client, factory, agent
    finally:
        engine.dispose()


def _stored(factory: Any) -> dict[str, Any]:
    with factory() as db:
        project = db.get(ProjectRow, "p1")
        assert project is not None
        return dict(project.settings or {})


def _refused(client: httpx.Client, body: Any, fragment: str) -> None:
    raw = body if isinstance(body, str) else json.dumps(body)
    r = client.put(URL, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert fragment in message, message


def test_bad_judge_configuration_is_a_400_and_changes_nothing(
    admin: tuple[httpx.Client, Any, str],
) -> None:
    client, factory, agent = admin
    before = _stored(factory)

    def judge(**change: Any) -> dict[str, Any]:
        spec = {k: v for k, v in {**JUDGE, **change}.items() if v is not None}
        return {"verifiers": ["exact_number", spec]}

    _refused(client, judge(mode="best-of"), "mode must be one of ['group', 'session', 'next_turn']")
    _refused(client, judge(judge=None), "verifiers[1].judge must name one of the operator's")
    _refused(client, judge(judge="p2s"), "[judges.p2s] is not granted to project 'p1'")
    _refused(client, judge(model="openai/gpt-4o"), "['model'] are the operator's to set")
    _refused(client, judge(api_base="http://127.0.0.1:1/v1"), "['api_base'] are the operator's")
    _refused(client, judge(rubric={"text": "x"}), "verifiers[1].rubric must be text")
    _refused(client, judge(rubric=7), "rubric must be text")
    _refused(client, judge(tempreature=0.5), "unknown parameters ['tempreature'] for 'judge'")
    _refused(client, judge(api_key_env="RLGATE_ADMIN_KEY"), "['api_key_env'] are the operator's")
    _refused(client, judge(calls_per_hour=10**9), "['calls_per_hour'] are the operator's")
    _refused(client, {"verifiers": [JUDGE, JUDGE]}, "at most once")
    _refused(client, {"verifiers": [{"name": "pydoc:pipepager"}]}, "registered verifier")
    _refused(client, {"verifiers": [JUDGE], "extra": 1}, '{"verifiers": [...]}')
    _refused(client, "[1, 2]", "must be a JSON object")
    assert r_ok(client.get(URL))["verifiers"] == ["exact_number"]
    assert _stored(factory) == before  # nothing changed
    with factory() as db:
        assert db.query(AuditEventRow).filter_by(action="verifiers.settings").count() == 0

    # an agent key may not change them; another project is not visible
    r = client.put(URL, json={"verifiers": [JUDGE]}, headers={"Authorization": f"Bearer {agent}"})
    assert r.status_code in (401, 403), r.text
    assert client.put("/admin/api/projects/p2/verifiers", json={"verifiers": []}).status_code in (
        403,
        404,
    )
    assert _stored(factory) == before


def test_a_good_judge_is_stored_and_its_budget_shown(
    admin: tuple[httpx.Client, Any, str],
) -> None:
    client, factory, _ = admin
    spec = {**JUDGE, "group_size": 8}
    out = r_ok(client.put(URL, json={"verifiers": ["exact_number", spec]}))
    assert out["verifiers"] == [{"name": "exact_number"}, spec]
    stored = _stored(factory)
    assert stored["verifiers"] == [{"name": "exact_number"}, spec] and stored["other"] == 1
    with factory() as db:
        assert db.query(AuditEventRow).filter_by(action="verifiers.settings").count() == 1
        for outcome, cost in (("ok", 0.01), ("unparsable", None), ("budget", None)):
            db.add(
                JudgeCallRow(
                    id=f"jc_{outcome}", project_id="p1", mode="group", model=MINI["model"],
                    outcome=outcome, attempt=1, cost_usd=cost, created_at=utcnow(),
                )
            )  # fmt: skip
        db.commit()
    judge = r_ok(client.get(URL))["judge"]
    assert (judge["model"], judge["mode"], judge["calls_per_hour"], judge["usd_per_hour"]) == (
        MINI["model"],
        "group",
        30,
        0.5,
    )
    assert judge["last_hour"]["calls"] == 2  # a refused call is not a call
    assert judge["last_hour"]["cost_usd"] == pytest.approx(0.01)
    assert judge["last_day"] == {"ok": 1, "unparsable": 1, "budget": 1}
    r_ok(client.put(URL, json={"verifiers": None}))  # null removes them
    assert "verifiers" not in _stored(factory)
    assert r_ok(client.get(URL))["judge"] is None


def test_session_credit_and_learning_curve_routes(admin: tuple[httpx.Client, Any, str]) -> None:
    client, factory, _ = admin
    with transaction(factory) as db:
        now = utcnow()
        db.add(SessionRow(id="s1", project_id="p1", status="closed", created_at=now,
                          last_activity_at=now, meta={}))  # fmt: skip
        db.add(SessionRow(id="s2", project_id="p2", status="closed", created_at=now,
                          last_activity_at=now, meta={}))  # fmt: skip
        db.flush()
        db.add(to_row(interaction("s1-0", "s1", 0, "4", reward=0.5)))
        db.add(
            FeedbackRow(
                id="fb1", project_id="p1", target_type="session", target_id="s1",
                session_id="s1", value=0.75, scale="scalar", scale_min=0.0, scale_max=1.0,
                reward=0.5, source="judge", rater="judge:session", rationale="mostly right",
                judge_model="openai/gpt-4o-mini", created_at=now,
            )
        )  # fmt: skip
    view = r_ok(client.get("/admin/api/sessions/s1/credit"))
    (turn,) = view["turns"]
    assert (turn["level"], turn["reward"], turn["origins"]) == ("session", 0.5, ["judge"])
    assert turn["ratings"][0]["rationale"] == "mostly right"
    assert turn["ratings"][0]["judge_model"] == "openai/gpt-4o-mini"
    assert client.get("/admin/api/sessions/s2/credit").status_code == 404  # another project
    assert client.get("/admin/api/sessions/nope/credit").status_code == 404
    curve = r_ok(client.get("/admin/api/projects/p1/learning-curve"))["items"]
    assert [(c["policy_version"], c["rated"], c["mean_reward"]) for c in curve] == [
        ("base", 1, 0.5)
    ]


def r_ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return dict(r.json())
