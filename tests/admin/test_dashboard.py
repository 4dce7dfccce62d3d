"""The admin dashboard in real headless Chromium, plus its auth rules over plain HTTP."""

from __future__ import annotations

import re

import httpx
import pytest
from sqlalchemy import select

from core.live_adapters import live_path
from schemas.tables import ApiKeyRow, AuditEventRow, PolicyVersionRow, ProjectRow, TrainingRunRow
from tests.admin.conftest import BIG_SESSIONS, Dash, login, shot
from trainer.config import TrainConfig

PAGES = [
    "/admin",
    "/admin/sessions",
    "/admin/sessions/sess_demo",
    "/admin/feedback",
    "/admin/runs",
    "/admin/runs/run_2",
    "/admin/adapters",
    "/admin/keys",
]
API_GETS = [
    "/admin/api/overview",
    "/admin/api/sessions",
    "/admin/api/sessions/sess_demo",
    "/admin/api/feedback",
    "/admin/api/runs",
    "/admin/api/runs/run_2",
    "/admin/api/adapters",
    "/admin/api/unloads",
    "/admin/api/keys",
]
FORM_POSTS = [
    "/admin/actions/train-now",
    "/admin/actions/pause",
    "/admin/actions/promote",
    "/admin/actions/rollback",
    "/admin/keys",
    "/admin/keys/key_x/revoke",
    "/admin/logout",
]


def _stored(dash: Dash, name: str) -> str:
    """Where the version ``name`` is stored (its ``path``)."""
    with dash.factory() as db:
        return db.scalars(select(PolicyVersionRow.path).where(PolicyVersionRow.name == name)).one()


def _statuses(dash: Dash) -> dict[str, str]:
    with dash.factory() as db:
        rows = db.scalars(select(PolicyVersionRow).where(PolicyVersionRow.project_id == "p1"))
        return {r.name: r.status for r in rows}


def _cookie_client(dash: Dash, key: str) -> tuple[httpx.Client, str]:
    """An HTTP client logged in through the form; returns it and the session's CSRF token."""
    c = httpx.Client(base_url=dash.url, follow_redirects=False, timeout=60)
    r = c.get("/admin/login")
    pre = re.search(r'name="csrf" value="([^"]+)"', r.text).group(1)
    r = c.post("/admin/login", data={"key": key, "csrf": pre, "next": "/admin"})
    assert r.status_code == 303, r.text
    r = c.get("/admin/keys")
    csrf = re.search(r'name="csrf" value="([^"]+)"', r.text).group(1)
    return c, csrf


# ---- auth, without a browser ----------------------------------------------------------


def test_without_cookie_pages_redirect_and_api_is_401(dash: Dash) -> None:
    with httpx.Client(base_url=dash.url, follow_redirects=False, timeout=60) as c:
        for path in PAGES:
            r = c.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/admin/login?next="), path
        for path in FORM_POSTS:
            r = c.post(path, data={"csrf": "x", "project_id": "p1", "target": "3"})
            assert r.status_code == 303 and "/admin/login" in r.headers["location"], path
        for path in API_GETS:
            assert c.get(path).status_code == 401, path
        assert c.post("/admin/api/actions/train-now", json={}).status_code == 401
        assert c.post("/admin/api/keys", json={"kind": "agent"}).status_code == 401
        # a forged cookie is no cookie
        c.cookies.set("rlgate_admin", "eyJrIjoiYm9vdHN0cmFwLWFkbWluIn0.AAAA", path="/admin")
        assert c.get("/admin").status_code == 303
        assert c.get("/admin/api/overview").status_code == 401


def test_agent_key_cannot_use_the_dashboard(dash: Dash) -> None:
    with httpx.Client(base_url=dash.url, follow_redirects=False, timeout=60) as c:
        r = c.get("/admin/login")
        pre = re.search(r'name="csrf" value="([^"]+)"', r.text).group(1)
        r = c.post("/admin/login", data={"key": dash.agent_key, "csrf": pre})
        assert r.status_code == 403
        assert "rlgate_admin=" not in r.headers.get("set-cookie", "").replace("_login", "")
        assert c.get("/admin").status_code == 303
        bearer = {"Authorization": f"Bearer {dash.agent_key}"}
        assert c.get("/admin/api/overview", headers=bearer).status_code == 403
        r = c.post("/admin/api/actions/train-now", headers=bearer, json={"project_id": "p1"})
        assert r.status_code == 403


def test_forged_forms_without_csrf_are_refused(dash: Dash) -> None:
    c, csrf = _cookie_client(dash, dash.admin_key)
    try:
        before = _statuses(dash)
        for path in FORM_POSTS:
            r = c.post(path, data={"project_id": "p1", "target": "p1-policy-v3"})
            assert r.status_code == 403, path
            r = c.post(path, data={"csrf": "wrong", "project_id": "p1", "target": "3"})
            assert r.status_code == 403, path
        assert _statuses(dash) == before
        # the JSON API with a cookie needs the token in a header
        r = c.post("/admin/api/actions/pause", json={"project_id": "p1"})
        assert r.status_code == 403
        r = c.post(
            "/admin/api/actions/pause", json={"project_id": "p1"}, headers={"X-CSRF-Token": csrf}
        )
        assert r.status_code == 200 and r.json()["training_paused"] is True
        r = c.post(
            "/admin/api/actions/resume", json={"project_id": "p1"}, headers={"X-CSRF-Token": csrf}
        )
        assert r.status_code == 200 and r.json()["training_paused"] is False
    finally:
        c.close()
    # login itself is CSRF-protected too
    r = httpx.post(dash.url + "/admin/login", data={"key": dash.admin_key}, timeout=60)
    assert r.status_code == 403


def test_json_api_with_bearer_admin_key(dash: Dash) -> None:
    h = {"Authorization": f"Bearer {dash.admin_key}"}
    with httpx.Client(base_url=dash.url, headers=h, timeout=60) as c:
        for path in API_GETS:
            assert c.get(path).status_code == 200, path
        ov = c.get("/admin/api/overview").json()
        assert [p["id"] for p in ov["projects"]] == ["p1"]  # a project key sees its project
        assert ov["projects"][0]["serving"] is not None
        s = c.get("/admin/api/sessions/sess_demo", params={"tokens": 1}).json()
        assert [t["policy_version"] for t in s["interactions"]] == ["p1-policy-v1", "p1-policy-v2"]
        assert s["interactions"][0]["tokens"][2]["p"] == pytest.approx(0.0821, abs=1e-3)
        run = c.get("/admin/api/runs/run_2").json()
        assert len(run["step_metrics"]) == 12 and run["samples"]["total"] == 1
        assert c.get("/admin/api/sessions", params={"project": "big"}).json()["total"] == 0
        created = c.post("/admin/api/keys", json={"kind": "feedback", "name": "api"}).json()
        assert created["secret"].startswith("rlg_feedback_")
        r = c.post(f"/admin/api/keys/{created['id']}/revoke")
        assert r.status_code == 200 and r.json()["revoked_at"]
    # the bootstrap admin sees every project
    h = {"Authorization": f"Bearer {dash.bootstrap_key}"}
    ov = httpx.get(dash.url + "/admin/api/overview", headers=h, timeout=60).json()
    assert {p["id"] for p in ov["projects"]} == {"p1", "big"}


def test_training_settings_api(dash: Dash) -> None:
    h = {"Authorization": f"Bearer {dash.admin_key}"}
    with httpx.Client(base_url=dash.url, headers=h, timeout=60) as c:
        url = "/admin/api/projects/p1/training"
        before = c.get(url).json()
        assert before["effective"]["lr"] == before["overrides"].get("lr", TrainConfig().lr)
        r = c.patch(url, json={"lr": 3e-4, "threshold": 16})
        assert r.status_code == 200, r.text
        assert r.json()["overrides"]["lr"] == 3e-4 and r.json()["effective"]["threshold"] == 16
        bad = c.patch(url, json={"lora_rank": 0, "nonsense": 1})
        assert bad.status_code == 400 and "nonsense" in bad.text
        bad = c.patch(url, json={"lr": "fast"})
        assert bad.status_code == 400
        assert c.get(url).json()["overrides"]["lr"] == 3e-4  # nothing half-written
        r = c.patch(url, json={"threshold": None})  # null removes the override
        assert "threshold" not in r.json()["overrides"]
        assert c.get("/admin/api/projects/big/training").status_code == 404  # not its project
        assert httpx.patch(dash.url + url, json={"lr": 1}, timeout=60).status_code == 401


# ---- the browser ---------------------------------------------------------------------


def test_login_overview_and_logout(page, dash: Dash) -> None:
    page.goto(dash.url + "/admin/runs")
    assert "/admin/login" in page.url  # redirected
    page.fill("input[name=key]", "rlg_admin_not-a-real-key")
    page.click("button[type=submit]")
    assert "unknown or revoked" in page.inner_text("#login-error")
    # where `rlgate up` keeps the admin key it printed (core/keys.py up_keys_path)
    assert "up-keys.json" in page.inner_text("#up-keys") and "rlgate up" in page.inner_text(
        "#up-keys"
    )
    login(page, dash)
    assert page.inner_text("#project-p1").count("p1-policy-v2") == 1
    assert page.locator("svg#chart-reward").count() == 1
    # the learning curve (mean reward and held-out eval by version) and the judge's line
    assert page.locator("#learning-p1 svg#curve-p1 polyline").count() == 2
    assert "no judge configured" in page.inner_text("#judge-p1")
    shot(page, "overview")
    page.click("nav button")
    page.wait_for_url("**/admin/login")
    page.goto(dash.url + "/admin")
    assert "/admin/login" in page.url


def test_finished_run_page_has_its_charts(page, dash: Dash) -> None:
    login(page, dash)
    page.click("nav >> text=Training runs")
    page.click(f"a[href='/admin/runs/{dash.finished_run}']")
    page.wait_for_url(f"**/admin/runs/{dash.finished_run}")
    for key in ("loss", "reward_mean", "kl", "clip_frac", "masked_frac", "tokens_per_s"):
        chart = page.locator(f"svg#chart-{key}")
        assert chart.count() == 1
        assert chart.locator("polyline").count() == 1
    assert "eval_new" in page.inner_text("#eval-gate")
    assert page.locator("#samples tbody tr").count() == 1
    shot(page, "run")
    page.goto(dash.url + f"/admin/runs/{dash.failed_run}")
    assert "CUDA out of memory" in page.inner_text("#run-error")


def test_session_trajectory(page, dash: Dash) -> None:
    login(page, dash)
    page.goto(dash.url + f"/admin/sessions/{dash.session_id}")
    text = page.inner_text("main")
    assert "What is the weather in Paris?" in text
    assert "get_weather" in text and "I should call the tool." in text
    assert '{"temp_c": 18}' in text and "It is 18 °C in Paris." in text
    assert page.locator(".policy").all_inner_texts() == ["p1-policy-v1", "p1-policy-v2"]
    assert page.locator(".reward").all_inner_texts() == ["0.5", "1"]
    assert page.locator(".tokens span").count() == 9
    # the credit table: alice's session rating decides both turns (gamma 1: no discount)
    assert page.locator("#credit .credit-row").count() == 2
    assert page.locator("#credit .credit-level").all_inner_texts() == ["session · discount 1"] * 2
    assert page.locator("#credit .credit-origin").all_inner_texts() == ["user", "user"]
    shot(page, "session")


def test_promote_and_roll_back(page, dash: Dash) -> None:
    login(page, dash)
    page.goto(dash.url + "/admin/adapters")
    page.click("#adapter-p1-policy-v3 button[data-action=promote]")
    page.wait_for_selector("#flash")
    assert "p1-policy-v3 is serving" in page.inner_text("#flash")
    assert _statuses(dash) == {
        "p1-policy-v1": "retired",
        "p1-policy-v2": "retired",
        "p1-policy-v3": "serving",
    }
    assert (
        "/load_lora_adapter",
        {"lora_name": "p1-policy-v3", "lora_path": str(live_path(_stored(dash, "p1-policy-v3")))},
    ) in dash.engine.calls
    assert "serving" in page.inner_text("#adapter-p1-policy-v3 .status")
    shot(page, "adapters")
    page.click("button:has-text('Roll back to the previous version')")
    page.wait_for_selector("#flash")
    assert "p1-policy-v2 is serving" in page.inner_text("#flash")
    assert _statuses(dash)["p1-policy-v2"] == "serving"
    assert _statuses(dash)["p1-policy-v3"] == "retired"
    with dash.factory() as db:
        actions = [
            e.action
            for e in db.scalars(
                select(AuditEventRow).where(AuditEventRow.target_type == "policy_version")
            )
        ]
    assert "adapter.promote" in actions and "adapter.rollback" in actions


def test_serve_the_base_model_and_back(page, dash: Dash) -> None:
    """The base model is a version (issue 38): the adapters page's button serves it (no
    version serving, audited as the base model), then "Serve again" brings v2 back."""
    login(page, dash)
    page.goto(dash.url + "/admin/adapters")
    serving = [n for n, st in _statuses(dash).items() if st == "serving"]
    assert len(serving) == 1
    page.click("button:has-text('Serve the base model')")
    page.wait_for_selector("#flash")
    assert "the base model is serving" in page.inner_text("#flash")
    assert "serving" not in _statuses(dash).values()
    assert "the base model serves (no adapter)" in page.inner_text("#rollback-p1")
    with dash.factory() as db:
        event = db.scalars(
            select(AuditEventRow)
            .where(AuditEventRow.target_type == "base_model")
            .order_by(AuditEventRow.created_at.desc())
        ).first()
    assert event is not None and event.action == "adapter.rollback"
    assert event.details["name"] == "base" and event.details["previous"] == serving[0]
    shot(page, "adapters-base")
    page.goto(dash.url + "/admin/adapters")
    page.click(f"#adapter-{serving[0]} button[data-action=rollback]")
    page.wait_for_selector("#flash")
    assert f"{serving[0]} is serving" in page.inner_text("#flash")
    assert _statuses(dash)[serving[0]] == "serving"


def test_create_and_revoke_a_key(page, dash: Dash) -> None:
    login(page, dash)
    page.goto(dash.url + "/admin/keys")
    page.select_option("#create-key select[name=kind]", "feedback")
    page.fill("#create-key input[name=name]", "rater bot")
    page.click("#create-key button[type=submit]")
    secret = page.inner_text("#secret").strip()
    assert secret.startswith("rlg_feedback_")
    shot(page, "keys")
    with dash.factory() as db:
        row = db.scalars(select(ApiKeyRow).where(ApiKeyRow.name == "rater bot")).one()
        key_id = row.id
    r = httpx.post(dash.url + "/feedback", headers={"Authorization": f"Bearer {secret}"}, json={})
    assert r.status_code != 401  # the key works (the empty body itself is refused)
    page.goto(dash.url + "/admin/keys")
    page.click(f"#key-{key_id} button[data-action=revoke]")
    page.wait_for_selector("#flash")
    assert page.locator(f"#key-{key_id}").count() == 0  # revoked keys are hidden by default
    with dash.factory() as db:
        assert db.get(ApiKeyRow, key_id).revoked_at is not None
    r = httpx.post(dash.url + "/feedback", headers={"Authorization": f"Bearer {secret}"}, json={})
    assert r.status_code == 401


def test_train_now_pause_and_resume(page, dash: Dash) -> None:
    login(page, dash)
    page.goto(dash.url + "/admin/runs")
    before = int(page.inner_text("#total"))
    page.click("button[data-action=pause]")
    page.wait_for_selector("#flash")
    with dash.factory() as db:
        assert db.get(ProjectRow, "p1").training_paused is True
    page.click("button[data-action=resume]")
    page.wait_for_selector("#flash")
    with dash.factory() as db:
        assert db.get(ProjectRow, "p1").training_paused is False
    page.click("button[data-action=train-now]")
    page.wait_for_url(re.compile(r".*/admin/runs/run_[0-9a-f]+\?msg=run\+queued"))
    run_id = page.url.split("/admin/runs/")[1].split("?")[0]
    assert page.locator("#live").count() == 1  # a queued run polls for progress
    assert "run queued" in page.inner_text("#flash")
    shot(page, "train-now")
    with dash.factory() as db:
        run = db.get(TrainingRunRow, run_id)
        assert (run.trigger, run.project_id) == ("manual", "p1")
    # published (as a worker would): the page reloads without the one-time message
    with dash.factory.begin() as db:
        db.get(TrainingRunRow, run_id).status = "published"
    page.wait_for_url(lambda url: url.endswith(f"/admin/runs/{run_id}"), timeout=30_000)
    page.wait_for_selector("#run-status .badge.tone-good:has-text('published')")
    assert page.locator("#flash").count() == 0 and page.locator("#live").count() == 0
    page.goto(dash.url + "/admin/runs")
    assert int(page.inner_text("#total")) == before + 1
    assert page.locator(f"a[href='/admin/runs/{run_id}']").count() == 1


def test_ten_thousand_sessions_render_one_page(page, dash: Dash) -> None:
    login(page, dash, dash.bootstrap_key)  # project "big" belongs to the bootstrap admin
    page.goto(dash.url + "/admin/sessions?project=big")
    assert int(page.inner_text("#total")) == BIG_SESSIONS
    assert page.locator("#sessions tbody tr").count() == 50
    shot(page, "sessions")
    page.click("a[rel=next]")
    page.wait_for_url("**page=2**")
    assert page.locator("#sessions tbody tr").first.inner_text().startswith("sess_big_00050")
    page.goto(dash.url + "/admin/sessions?project=big&status=closed&agent=other-agent")
    # closed: i % 3 == 0, other-agent: i even -> i % 6 == 0
    assert int(page.inner_text("#total")) == len(range(0, BIG_SESSIONS, 6))
    page.goto(dash.url + "/admin/sessions?project=big&rated=yes")
    assert int(page.inner_text("#total")) == 0
