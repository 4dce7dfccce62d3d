"""What the dashboard's pages show of issue #18 (credit, learning, the judge), on the real
gateway app (served in-process) over SQLite and PostgreSQL, read as HTML through a
logged-in cookie:

- the session page's credit table: per turn the reward, the level that decided it (with a
  session rating's discount), the origin of the ratings behind it, and a judge's model
  and rationale, HTML-escaped (it is model text), the same as the JSON credit route;
- the overview's learning curve (mean reward by policy version, held-out eval) and the
  judge's budget line; and the empty states ("no ratings yet", "no judge configured").

No engine is needed, so the gateway points at a closed port."""

from __future__ import annotations

import html
import json
import re
import secrets
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from markupsafe import escape

from core.db import make_engine, session_factory, transaction
from core.migrate import upgrade
from schemas.coltypes import utcnow
from schemas.convert import to_row
from schemas.tables import (
    FeedbackRow,
    JudgeCallRow,
    PolicyVersionRow,
    ProjectRow,
    RunHintRow,
    SessionRow,
    TrainingRunRow,
)
from tests.gateway.fake_engine import in_process_gateway
from tests.rows import interaction
from tests.servers import free_port

ADMIN = "rlg_admin_credit_" + secrets.token_urlsafe(12)
MODEL = "openai/gpt-4o-mini"
JUDGE = {"name": "judge", "judge": "mini", "mode": "session", "rubric": "Be right."}
# the operator's entry, in the gateway's configuration
JUDGES = json.dumps({"mini": {"model": MODEL, "calls_per_hour": 30, "usd_per_hour": 0.5}})
RATIONALE = '<script>alert("x")</script> the <b>answer</b> is right & complete'
HINT = "Shorter <i>please</i> & one sentence"  # a user's words: shown escaped


def _seed(factory: Any) -> None:
    """p1 (gamma 0.9, a judge): session s1 of three turns; turn 0 rated by the judge's
    next-turn reading, the session by the judge, turn 2 by a user. p2 (no judge): an
    open session s2 of one unrated turn."""
    now = utcnow()
    settings = {"credit_assignment": {"gamma": 0.9, "unrated": "skip"}, "verifiers": [JUDGE]}
    with transaction(factory) as db:
        db.add(ProjectRow(id="p1", name="Judged", created_at=now, settings=settings))
        db.add(ProjectRow(id="p2", name="Plain", created_at=now))
        db.flush()
        db.add(
            PolicyVersionRow(
                id="pv_1", project_id="p1", name="p1-policy-v1", version=1,
                base_model="base", path="/tmp/adapters/p1-policy-v1", lora_config={"r": 8},
                status="serving", eval_metrics={"eval_new": 0.7, "eval_serving": 0.5},
                created_at=now - timedelta(hours=1),
            )
        )  # fmt: skip
        for sid, pid, status in (("s1", "p1", "closed"), ("s2", "p2", "open")):
            db.add(SessionRow(id=sid, project_id=pid, status=status, created_at=now,
                              last_activity_at=now, meta={}))  # fmt: skip
        db.flush()
        # rewards as credit assignment stores them: -0.5 (next turn), 0.9 * 0.5, 1.0 (user)
        for seq, version, reward in ((0, "base", -0.5), (1, "p1-policy-v1", 0.45),
                                     (2, "p1-policy-v1", 1.0)):  # fmt: skip
            db.add(to_row(interaction(f"i{seq}", "s1", seq, policy_version=version,
                                      reward=reward)))  # fmt: skip
        db.add(to_row(interaction("j0", "s2", 0, project_id="p2")))

        def rating(fid: str, target: str, ref: str, reward: float, **kw: Any) -> FeedbackRow:
            return FeedbackRow(
                id=fid, project_id="p1", target_type=target, target_id=ref, session_id="s1",
                value=reward, scale="scalar", scale_min=-1.0, scale_max=1.0, reward=reward,
                created_at=now, **kw,
            )  # fmt: skip

        db.add(rating("fb_next", "interaction", "i0", -0.5, source="judge",
                      rater="judge:next_turn", comment="next turn: correction",
                      rationale="the user corrected it", judge_model=MODEL))  # fmt: skip
        db.add(rating("fb_rules", "interaction", "i0", -0.5, source="next_turn",
                      rater="rules:next_turn",
                      comment='next turn: correction (cue: "no")'))  # fmt: skip
        db.add(rating("fb_judge", "session", "s1", 0.5, source="judge", rater="judge:session",
                      rationale=RATIONALE, judge_model=MODEL))  # fmt: skip
        db.add(rating("fb_user", "interaction", "i2", 1.0, source="user", rater="alice"))
        # the run that trained i2 with alice's comment as its teacher's hint
        db.add(TrainingRunRow(id="run_h", project_id="p1", trigger="manual", status="published",
                              created_at=now))  # fmt: skip
        db.flush()
        db.add(RunHintRow(id="hint_1", run_id="run_h", interaction_id="i2", feedback_id="fb_user",
                          origin="comment", text=HINT, teacher="base", adv_mean=0.25,
                          created_at=now))  # fmt: skip
        calls = [("ok", 0.012, 5), ("unparsable", None, 10), ("timeout", None, 20),
                 ("budget", None, 30), ("error", None, 180)]  # fmt: skip
        for n, (outcome, cost, minutes_ago) in enumerate(calls):
            db.add(
                JudgeCallRow(
                    id=f"jc_{n}", project_id="p1", session_id="s1", mode="session", model=MODEL,
                    outcome=outcome, attempt=1, cost_usd=cost,
                    created_at=now - timedelta(minutes=minutes_ago),
                )
            )  # fmt: skip


@pytest.fixture
def client(db_url: str, tmp_path: Path) -> Iterator[httpx.Client]:
    """A client logged in to the dashboard with the bootstrap admin key (every project)."""
    upgrade(db_url)
    engine = make_engine(db_url)
    factory = session_factory(engine)
    _seed(factory)
    closed_engine = f"http://127.0.0.1:{free_port()}"
    try:
        with (
            in_process_gateway(
                tmp_path / "gw", db_url, closed_engine, admin_key=ADMIN, judges=JUDGES
            ) as gw,
            httpx.Client(base_url=gw.url, follow_redirects=False, timeout=60) as c,
        ):
            pre = re.search(r'name="csrf" value="([^"]+)"', c.get("/admin/login").text)
            assert pre is not None
            r = c.post("/admin/login", data={"key": ADMIN, "csrf": pre.group(1), "next": "/admin"})
            assert r.status_code == 303, r.text
            yield c
    finally:
        engine.dispose()


def _text(fragment: str) -> str:
    """The visible text of an HTML fragment, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def _by_id(page: str, tag: str, ident: str) -> str:
    m = re.search(rf'<{tag}[^>]*id="{re.escape(ident)}"[^>]*>(.*?)</{tag}>', page, re.S)
    assert m is not None, f"no <{tag} id={ident}>"
    return m.group(1)


def _credit_rows(page: str) -> dict[str, str]:
    rows = re.findall(r'<tr class="credit-row" data-interaction="([^"]+)">(.*?)</tr>', page, re.S)
    return dict(rows)


def _page(client: httpx.Client, path: str) -> str:
    r = client.get(path)
    assert r.status_code == 200, r.text
    return r.text


def test_session_page_shows_each_turns_credit_and_where_it_came_from(client: httpx.Client) -> None:
    page = _page(client, "/admin/sessions/s1")
    rows = _credit_rows(page)
    assert list(rows) == ["i0", "i1", "i2"]
    cells = {
        i: dict(re.findall(r'<td class="credit-(\w+)">(.*?)</td>', row, re.S))
        for i, row in rows.items()
    }
    got = {
        i: (c["turn"], _text(c["reward"]), _text(c["level"]), c["origin"]) for i, c in cells.items()
    }
    assert got == {
        "i0": ("0", "-0.5", "interaction", "next_turn, next_turn_rules"),
        "i1": ("1", "0.45", "session · discount 0.9", "judge"),
        "i2": ("2", "1", "interaction", "user"),
    }
    # the judge's model and rationale, escaped: the model's text is never markup
    assert MODEL in rows["i1"] and "judge:session" in rows["i1"]
    assert str(escape(RATIONALE)) in rows["i1"]
    assert "<script>" not in page and "<b>answer</b>" not in page
    assert "the user corrected it" in rows["i0"] and "next turn: correction" in rows["i0"]
    # the rules' rating beside the judge's, each origin explained on hover
    assert "rules:next_turn" in rows["i0"] and "(cue: &#34;no&#34;)" in rows["i0"]
    assert 'title="the rules reading the user&#39;s next message">next_turn_rules</b>' in rows["i0"]
    assert "alice" in rows["i2"] and "rationale" not in rows["i2"]
    # the hint the teacher saw, beside the credit, escaped; the other turns have none
    assert str(escape(HINT)) in cells["i2"]["hint"] and "<i>please</i>" not in page
    assert "teacher base" in _text(cells["i2"]["hint"]) and "run_h" in cells["i2"]["hint"]
    assert _text(cells["i0"]["hint"]) == "–"
    assert "no ratings yet" not in page

    # the same as the JSON credit route (both are trainer.api.session_credit)
    credit = client.get("/admin/api/sessions/s1/credit")
    assert credit.status_code == 200, credit.text
    turns = credit.json()["turns"]
    assert [t["interaction_id"] for t in turns] == list(rows)
    assert [t["level"] for t in turns] == ["interaction", "session", "interaction"]
    assert turns[1]["discount"] == pytest.approx(0.9)
    assert [t["origins"] for t in turns] == [["next_turn", "next_turn_rules"], ["judge"], ["user"]]
    assert [[h["text"] for h in t["hints"]] for t in turns] == [[], [], [HINT]]
    assert turns[2]["hints"][0] == {
        "run_id": "run_h",
        "origin": "comment",
        "text": HINT,
        "teacher": "base",
        "adv_mean": 0.25,
    }

    # a session without ratings
    page = _page(client, "/admin/sessions/s2")
    assert "no ratings yet" in page
    (row,) = _credit_rows(page).values()
    assert "unrated" in _text(row) and ">none<" in row
    assert client.get("/admin/sessions/nope").status_code == 404


def test_overview_shows_learning_curve_and_judge_budget(client: httpx.Client) -> None:
    page = _page(client, "/admin")
    # learning curve: a chart per project (the shared SVG helper) and its numbers
    curve = _by_id(page, "div", "learning-p1")
    assert 'id="curve-p1"' in curve and "<polyline" in curve and "held-out eval" in curve
    versions = [
        [_text(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r'<tr class="curve-row">(.*?)</tr>', curve, re.S)
    ]
    assert versions == [
        ["base", "1", "1", "-0.5", "–"],
        ["p1-policy-v1", "2", "2", "0.725", "0.7"],
    ]
    assert "no ratings yet" not in curve
    assert "no ratings yet" in _by_id(page, "div", "learning-p2")
    # the judge's budget: counted calls of the last hour (a budget refusal is not one),
    # known cost against the USD budget, calls that gave no rating
    judge = _text(_by_id(page, "dd", "judge-p1"))
    assert MODEL in judge and "(session)" in judge
    assert "3 / 30 calls in the last hour" in judge
    assert "$0.0120 / $0.50" in judge
    assert "3 skipped or failed (budget 1, timeout 1, unparsable 1), 4 in 24 h" in judge
    assert _text(_by_id(page, "dd", "judge-p2")) == "no judge configured"
    # the same data as the JSON routes
    lc = client.get("/admin/api/projects/p1/learning-curve").json()["items"]
    assert [(c["policy_version"], c["eval"]) for c in lc] == [("base", None), ("p1-policy-v1", 0.7)]
