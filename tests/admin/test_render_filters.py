"""The dashboard's render filters and the adapters page's rollback button, rendered by the
dashboard's own Jinja environment (no browser): numbers without an exponent in their
everyday range, singular counts, and a rollback offered only where there is a version
to roll back to, naming the version it replaces."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.admin.render import _num, _plural, env


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


def test_rollback_button_only_with_an_earlier_version():
    none = _adapters_page([])
    assert 'data-action="rollback"' not in none and "no adapter to roll back" in none

    only = _adapters_page([_v(1, "serving")])
    assert 'data-action="rollback"' not in only
    assert "p1-policy-v1 serves; no earlier version to roll back to" in only

    candidate = _adapters_page([_v(2, "candidate"), _v(1, "serving")])
    assert 'data-action="rollback"' not in candidate

    two = _adapters_page([_v(3, "candidate"), _v(2, "serving"), _v(1, "retired")])
    assert "Roll back to the previous version (from p1-policy-v2)" in two
    # one project-wide button, plus "Serve again" on the retired row
    assert two.count('data-action="rollback"') == 2
