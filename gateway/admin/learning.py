"""What the dashboard's pages show of credit assignment, learning and the judge: each
turn's credit on the session page, and per project on the overview the learning curve
(mean reward by policy version, held-out eval where configured) and the judge's budget.

The data comes from the same ``trainer.api`` functions the JSON routes use
(``/admin/api/sessions/<id>/credit``, ``/admin/api/projects/<p>/learning-curve``,
``/admin/api/projects/<p>/verifiers``); the gateway enters the trainer only there. All
functions here block (database reads): call them in a thread.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gateway.admin import charts

OK_OUTCOME = "ok"  # trainer/judge.py: every other outcome is a call that gave no rating


def session_credit(factory: sessionmaker[Session], session_id: str) -> dict[str, Any] | None:
    """``trainer.api.session_credit`` (the credit route's answer), plus ``rated``: whether
    any turn has a rating behind its reward."""
    from trainer import api as trainer_api

    out = trainer_api.session_credit(factory, session_id)
    if out is not None:
        out["rated"] = any(t["ratings"] for t in out["turns"])
    return out


def judge_view(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """``trainer.api.judge_usage`` plus the calls that gave no rating (``failed``: every
    outcome but ``ok``: unparsable, timeout, error, and the refused ``budget``/``refused``)
    in the last hour and the last 24 hours; None without a judge."""
    if usage is None or "error" in usage:
        return usage
    hour = usage["last_hour"]["outcomes"]
    return {
        **usage,
        "failed_last_hour": sum(n for o, n in hour.items() if o != OK_OUTCOME),
        "failed_last_day": sum(n for o, n in usage["last_day"].items() if o != OK_OUTCOME),
        "failed_outcomes": {o: n for o, n in sorted(hour.items()) if o != OK_OUTCOME},
    }


def curve_chart(project_id: str, items: list[dict[str, Any]]) -> str:
    """The learning curve as an SVG line chart: mean reward of the rated interactions of
    each policy version, and the eval gate's held-out score where one was measured."""
    series: dict[str, list[float | None]] = {"mean reward": [i["mean_reward"] for i in items]}
    if any(i["eval"] is not None for i in items):
        series["held-out eval"] = [
            float(i["eval"]) if isinstance(i["eval"], int | float) else None for i in items
        ]
    return charts.line_chart(
        "reward by version",
        series,
        x_labels=[i["policy_version"] for i in items] or None,
        chart_id=f"curve-{project_id}",
    )


def project_learning(
    factory: sessionmaker[Session], project_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Per project: ``curve`` (``trainer.api.learning_curve``), its ``chart`` (SVG),
    ``rated`` (whether any version has rated interactions) and ``judge``
    (:func:`judge_view`, None without a judge)."""
    from trainer import api as trainer_api

    out: dict[str, dict[str, Any]] = {}
    for pid in project_ids:
        curve = trainer_api.learning_curve(factory, pid)
        try:
            usage = trainer_api.judge_usage(factory, pid)
        except LookupError:  # the project went away between the two reads
            usage = None
        out[pid] = {
            "curve": curve,
            "chart": curve_chart(pid, curve),
            "rated": any(i["rated"] for i in curve),
            "judge": judge_view(usage),
        }
    return out
