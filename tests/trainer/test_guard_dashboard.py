"""A guard's rollback on the dashboard (SQLite and PostgreSQL): the banner on the
project's overview card, the event on its run in the run list and on the run page, and
the trust-region/entropy/masked-split charts of the run view. The rollback is written by
the real serving switch (trainer/publish.py switch_serving, the path guards.enforce
takes after loading the adapter), the pages by the dashboard's own queries and templates.
"""

from __future__ import annotations

from starlette.requests import Request

from core.db import transaction
from gateway.admin import queries
from gateway.admin.pages import _run_charts
from gateway.admin.render import env
from schemas.coltypes import utcnow
from schemas.tables import TrainingRunRow
from tests.trainer.helpers import make_project
from tests.trainer.test_guards import _version
from trainer import publish


def _request(path: str) -> Request:
    return Request(
        {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}
    )


def test_guard_rollback_shows_as_banner_run_event_and_charts(migrated_db) -> None:
    factory = migrated_db
    pid = make_project(factory, {})
    _version(factory, pid, 1, "retired")
    v2 = _version(factory, pid, 2, "serving")
    with factory() as db:
        from sqlalchemy import select

        from schemas.tables import PolicyVersionRow

        v1_id = db.scalars(
            select(PolicyVersionRow.id).where(
                PolicyVersionRow.project_id == pid, PolicyVersionRow.version == 1
            )
        ).one()
    details = {
        "reason": "guard:reward",
        "rolled_back": v2,
        "serving_stats": {"mean_reward": -0.8, "units": 8},
        "best_stats": {"mean_reward": 0.45, "units": 9},
        "p_value": 0.0004,
    }
    publish.switch_serving(
        factory, pid, v1_id, actor="guard", action="adapter.rollback", details=details
    )
    steps = [
        {"step": 1, "loss": 0.1, "kl": 0.0, "kl_prox": 0.0, "entropy": 1.7},
        {
            "step": 2,
            "loss": 0.2,
            "kl": 0.01,
            "kl_prox": 0.03,
            "entropy": 1.5,
            "masked_stale_frac": 0.1,
            "masked_mismatch_frac": 0.0,
            "stopped_early": True,
        },
    ]
    with transaction(factory) as db:
        db.add(
            TrainingRunRow(
                id="run_guarded",
                project_id=pid,
                trigger="threshold",
                status="cancelled",
                config={
                    "data_stats": {
                        "guard": {**details, "serving": f"{pid}-policy-v1"},
                        "run_metrics": {"stopped_early": True},
                    }
                },
                step_metrics=steps,
                created_at=utcnow(),
            )
        )

    with factory() as db:
        ov = queries.overview(db, [pid])
        page = queries.runs(db, [pid], {})
        run = queries.run_detail(db, [pid], "run_guarded")
    (card,) = ov["projects"]
    assert card["guard"]["reason"] == "guard:reward"
    assert card["guard"]["rolled_back"] == v2 and card["guard"]["to"] == f"{pid}-policy-v1"
    # the page adds this gateway's recording figures (gateway/admin/ops.py)
    ov["recording"] = {"pending": 0, "lag_s": 0.0, "dead_letters": 0, "dead_letter_file": "-"}
    html = env.get_template("overview.html").render(
        request=_request("/admin"), ov=ov, charts=[], csrf="x"
    )
    assert f'id="guard-{pid}"' in html and "Guard rolled back" in html
    assert f"{v2} &rarr; {pid}-policy-v1" in html and "guard:reward" in html

    (item,) = page.items
    assert item["guard"]["rolled_back"] == v2 and item["stopped_early"]
    html = env.get_template("runs.html").render(
        request=_request("/admin/runs"), page=page, projects=ov["projects"], f={}, csrf="x"
    )
    assert "rolled back" in html and "stopped early" in html

    assert run is not None
    assert run["series"]["kl_prox"] == [0.0, 0.03]
    assert run["series"]["masked_stale_frac"] == [None, 0.1]
    charts = "".join(_run_charts(run))
    for key in ("kl_prox", "entropy", "masked_stale_frac", "masked_mismatch_frac"):
        assert f'id="chart-{key}"' in charts
    html = env.get_template("run.html").render(
        request=_request("/admin/runs/run_guarded"), run=run, charts=[], live=False, csrf="x"
    )
    assert 'id="run-guard"' in html and "guard:reward" in html
