"""The dashboard's render filters and the adapters page's rollback button, rendered by the
dashboard's own Jinja environment (no browser): numbers without an exponent in their
everyday range, singular counts, and a rollback offered only where there is a version
to roll back to, naming the version it replaces."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from gateway.admin.render import TONES, _num, _plural, _rating, env
from schemas.atdp import (
    FeedbackSource,
    FeedbackTarget,
    KeyKind,
    PolicyStatus,
    RunStatus,
    RunTrigger,
    SessionStatus,
)


@pytest.mark.parametrize(
    "value,shown",
    [
        (5240.3, "5240"),  # a latency in ms: was 5.24e+03
        (123456.0, "123456"),
        (12.345, "12.3"),
        (99.96, "100"),
        (0.12345, "0.123"),
        (1.0, "1"),
        (-3.25, "-3.25"),
        (0.0, "0"),
        (1.234e-5, "1.23e-05"),  # tiny values keep their exponent
        (2e10, "2.00e+10"),
        (None, "–"),
        (7, "7"),
    ],
)
def test_num(value, shown):
    assert _num(value) == shown


def test_num_in_a_template_has_no_exponent_for_latencies():
    out = env.from_string("{{ v|num }} ms").render(v=5240.0)
    assert out == "5240 ms" and "e+" not in out


def test_plural():
    assert _plural(1, "interaction") == "1 interaction"
    assert _plural(2, "interaction") == "2 interactions"
    assert _plural(0, "step") == "0 steps"
    assert _plural([object()], "interaction") == "1 interaction"
    assert env.from_string("{{ xs|plural('interaction') }}").render(xs=[1]) == "1 interaction"


def _adapters_page(items: list[dict]) -> str:
    request = SimpleNamespace(url=SimpleNamespace(path="/admin/adapters"), query_params={})
    return env.get_template("adapters.html").render(
        request=request, items=items, projects=["p1"], f={}, csrf="c", who=None
    )


def _v(version: int, status: str) -> dict:
    return {
        "project_id": "p1",
        "name": f"p1-policy-v{version}",
        "version": version,
        "status": status,
        "parent_name": None,
        "created_by_run_id": None,
        "eval_metrics": {},
        "created_at": None,
        "promoted_at": None,
    }


def test_rollback_buttons_and_the_base_model():
    """While a version serves, the base model is always a version to go back to: a button
    "Serve the base model" (target ``base``); "Roll back to the previous version" only
    where a retired version exists. While the base model serves, no rollback."""
    none = _adapters_page([])
    assert 'data-action="rollback"' not in none and "the base model serves" in none

    only = _adapters_page([_v(1, "serving")])
    assert only.count('data-action="rollback"') == 1
    assert "Serve the base model (from p1-policy-v1)" in only
    assert 'name="target" value="base"' in only

    candidate = _adapters_page([_v(2, "candidate"), _v(1, "serving")])
    assert candidate.count('data-action="rollback"') == 1  # the base model only

    two = _adapters_page([_v(3, "candidate"), _v(2, "serving"), _v(1, "retired")])
    assert "Roll back to the previous version (from p1-policy-v2)" in two
    # the previous version, the base model, and "Serve again" on the retired row
    assert two.count('data-action="rollback"') == 3

    after_base = _adapters_page([_v(2, "retired"), _v(1, "retired")])
    assert "the base model serves (no adapter)" in after_base
    assert after_base.count('data-action="rollback"') == 2  # "Serve again" on each


def test_pending_unloads_are_listed():
    request = SimpleNamespace(url=SimpleNamespace(path="/admin/adapters"), query_params={})
    unload = {
        "project_id": "p1",
        "name": "p1-policy-v2",
        "state": "waiting",
        "in_flight": 2,
        "waited_s": 75.0,
        "unload_by_s": 525.0,
    }
    page = env.get_template("adapters.html").render(
        request=request,
        items=[_v(1, "serving"), _v(2, "retired")],
        projects=["p1"],
        f={},
        csrf="c",
        who=None,
        unloads=[unload],
    )
    assert 'id="unload-p1-policy-v2"' in page and "1m15s" in page and "8m45s" in page
    assert '<td class="in-flight">2</td>' in page


@pytest.mark.parametrize(
    "value,scale,shown",
    [
        (False, "binary", "down"),
        (True, "binary", "up"),
        (0, "binary", "down"),
        (1, "binary", "up"),
        (-1, "binary", "down"),
        ("thumbs_up", "binary", "up"),
        (4.0, "stars-5", "4"),
        (0.25, "scalar", "0.25"),
    ],
)
def test_binary_ratings_show_as_up_or_down(value, scale, shown):
    assert _rating(value, scale) == shown


def test_the_feedback_list_explains_the_binary_mapping():
    request = SimpleNamespace(url=SimpleNamespace(path="/admin/feedback"), query_params={})
    row = {
        "created_at": None,
        "project_id": "p1",
        "session_id": "sess_1",
        "target_type": "interaction",
        "target_id": "chatcmpl-1",
        "value": False,
        "scale": "binary",
        "reward": -1.0,
        "source": "user",
        "rater": None,
        "comment": None,
    }
    page = SimpleNamespace(items=[row], total=1, page=1, pages=1)
    out = env.get_template("feedback.html").render(
        request=request, page=page, f={}, projects=["p1"], csrf="c", who=None
    )
    assert '<td class="value"' in out and ">down</td>" in out
    assert "down (false, 0, -1" in out and "is reward -1" in out


@pytest.mark.parametrize(
    "template,field,values",
    [
        ("runs.html", "status", RunStatus),
        ("runs.html", "trigger", RunTrigger),
        ("feedback.html", "source", FeedbackSource),
        ("feedback.html", "target_type", FeedbackTarget),
        ("sessions.html", "status", SessionStatus),
        ("keys.html", "kind", KeyKind),
    ],
)
def test_a_list_filter_offers_what_its_rows_can_hold(template, field, values):
    """Each list filter's choices are the values of the column it filters (was: the run
    filter offered 'succeeded', 'rejected' and 'skipped', which no run has, and lacked
    'cancelled'; the feedback filter lacked 'next_turn')."""
    request = SimpleNamespace(url=SimpleNamespace(path="/admin/x"), query_params={})
    page = SimpleNamespace(items=[], total=0, page=1, pages=1)
    out = env.get_template(template).render(
        request=request, page=page, f={}, projects=[], csrf="c", who=None, keys=[], items=[]
    )
    filters = re.search(r'<form class="filters" method="get">.*?</form>', out, re.S)
    assert filters is not None, out[:2000]
    select = re.search(rf'<select name="{field}"[^>]*>(.*?)</select>', filters.group(0), re.S)
    assert select is not None, filters.group(0)
    offered = re.findall(r'<option value="([^"]*)"', select.group(1))
    assert [v for v in offered if v] == [v.value for v in values]


def test_every_status_has_a_badge_colour_and_the_stylesheet_has_it() -> None:
    """A status added to schemas/atdp.py gets a colour here or fails this test (the runs
    list once showed ``cancelled`` runs uncoloured); every tone has its style."""
    statuses = [m for e in (PolicyStatus, RunStatus, SessionStatus) for m in e]
    assert sorted(set(statuses) - set(TONES)) == []
    css = env.get_template("base.html").render(request=None, who=None, ctx=None)
    for tone in set(TONES.values()):
        assert f".tone-{tone}{{" in css, tone
    badge = env.get_template("_macros.html").module.badge  # type: ignore[attr-defined]
    assert 'class="badge tone-warn"' in str(badge(RunStatus.trained_not_published.value))
    assert 'class="badge tone-done"' in str(badge(RunStatus.cancelled.value))
