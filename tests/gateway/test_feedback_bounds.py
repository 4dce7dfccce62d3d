"""Scalar feedback near the float limits: a 400 that says what to fix, never an overflow,
never a NaN turned into a reward (issue #14 row 13)."""

from __future__ import annotations

import math

import pytest

from core.errors import APIError
from gateway.routes.feedback import MAX_ABS, _clip, normalize, parse_feedback


@pytest.mark.parametrize(
    ("value", "lo", "hi", "param"),
    [
        (0.0, -1.7e308, 1.7e308, "min"),  # the reported case: span overflowed to inf
        (1e300, 0, 1.7e308, "value"),
        (0.5, 0, 10**400, "max"),  # an int no float can hold
        (0.0, -(10**16), 1, "min"),
        (float("nan"), 0, 1, "value"),
        (0.0, float("-inf"), 1, "min"),
    ],
)
def test_out_of_bounds_scalar_is_a_400_naming_the_field(value, lo, hi, param):
    with pytest.raises(APIError) as e:
        normalize(value, "scalar", lo, hi)
    assert e.value.status == 400 and e.value.param == param


def test_widest_allowed_range_maps_the_midpoint_to_zero():
    value, reward, lo, hi = normalize(0.0, "scalar", -MAX_ABS, MAX_ABS)
    assert (value, lo, hi) == (0.0, -MAX_ABS, MAX_ABS)
    assert reward == 0.0
    assert normalize(MAX_ABS, "scalar", -MAX_ABS, MAX_ABS)[1] == 1.0
    assert normalize(-MAX_ABS, "scalar", -MAX_ABS, MAX_ABS)[1] == -1.0


def test_tiny_ranges_stay_finite():
    tiny = 5e-324  # the smallest subnormal
    for v in (0.0, tiny):
        reward = normalize(v, "scalar", 0.0, tiny)[1]
        assert math.isfinite(reward) and -1.0 <= reward <= 1.0


def test_nan_never_becomes_a_reward():
    with pytest.raises(APIError) as e:
        _clip(float("nan"))
    assert e.value.status == 400
    assert _clip(3.0) == 1.0 and _clip(-3.0) == -1.0


def test_parse_feedback_rejects_the_overflowing_body():
    body = {"interaction_id": "x", "value": 0, "scale": "scalar", "min": -1.7e308, "max": 1.7e308}
    with pytest.raises(APIError) as e:
        parse_feedback(body)
    assert e.value.status == 400 and "between" in e.value.message
