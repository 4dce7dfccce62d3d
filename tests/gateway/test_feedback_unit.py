"""Feedback normalization and request parsing (no database)."""

from __future__ import annotations

import pytest

from core.errors import APIError
from gateway.routes.feedback import normalize, parse_feedback


@pytest.mark.parametrize(
    ("value", "scale", "lo", "hi", "reward"),
    [
        (True, "binary", None, None, 1.0),
        (False, "binary", None, None, -1.0),
        (1, "binary", None, None, 1.0),
        (0, "binary", None, None, -1.0),
        (-1, "binary", None, None, -1.0),
        ("up", "binary", None, None, 1.0),
        ("down", "binary", None, None, -1.0),
        ("thumbs_up", "thumbs", None, None, 1.0),
        ("thumbs_down", "thumbs", None, None, -1.0),
        (1, "stars-5", None, None, -1.0),
        (2, "stars-5", None, None, -0.5),
        (3, "stars-5", None, None, 0.0),
        (4, "stars-5", None, None, 0.5),
        (5, "stars-5", None, None, 1.0),
        (0.0, "scalar", None, None, -1.0),
        (0.5, "scalar", None, None, 0.0),
        (0.75, "scalar", None, None, 0.5),
        (1.0, "scalar", None, None, 1.0),
        (7, "scalar", 0, 10, 0.4),
        (-5, "scalar", -10, 10, -0.5),
        (0.25, "scalar", -1, 1, 0.25),
    ],
)
def test_normalization_is_linear_onto_minus_one_one(value, scale, lo, hi, reward):
    _, got, _, _ = normalize(value, scale, lo, hi)
    assert got == pytest.approx(reward)


@pytest.mark.parametrize(
    ("value", "scale", "lo", "hi"),
    [
        (2, "binary", None, None),
        (5, "binary", None, None),
        ("maybe", "binary", None, None),
        (0, "stars-5", None, None),
        (6, "stars-5", None, None),
        (1.5, "scalar", None, None),
        (-0.1, "scalar", None, None),
        (11, "scalar", 0, 10),
    ],
)
def test_out_of_range_is_400(value, scale, lo, hi):
    """A value out of its scale's range is a 400, as every other validation error (issue
    38: binary ``5`` was a 422)."""
    with pytest.raises(APIError) as e:
        normalize(value, scale, lo, hi)
    assert e.value.status == 400
    assert e.value.param == "value"


@pytest.mark.parametrize(
    ("value", "scale", "lo", "hi"),
    [
        ("4", "stars-5", None, None),
        (True, "stars-5", None, None),
        (0.5, "scalar", 1, 1),
        (0.5, "scalar", 1, 0),
        (1, "stars-5", 0, 5),
        (1, "percent", None, None),
        (float("nan"), "scalar", None, None),
    ],
)
def test_malformed_is_400(value, scale, lo, hi):
    with pytest.raises(APIError) as e:
        normalize(value, scale, lo, hi)
    assert e.value.status == 400


def test_stored_values_and_ranges():
    assert normalize("thumbs_up", "thumbs")[0] is True
    assert normalize(4, "stars-5") == (4.0, 0.5, None, None)
    assert normalize(7, "scalar", 0, 10)[2:] == (0.0, 10.0)
    assert normalize(0.5, "scalar")[2:] == (0.0, 1.0)


def test_parse_targets_and_defaults():
    inp = parse_feedback({"interaction_id": "chatcmpl-1", "value": "up"})
    assert (inp.target, inp.ref, inp.scale, inp.reward, inp.source) == (
        "interaction",
        "chatcmpl-1",
        "binary",
        1.0,
        "user",
    )
    inp = parse_feedback({"session": "latest", "value": 4, "scale": "stars-5"})
    assert (inp.target, inp.ref, inp.reward) == ("latest", None, 0.5)
    inp = parse_feedback({"session_id": "sess_x", "value": 0.25, "source": "user"})
    assert (inp.target, inp.ref, inp.scale, inp.reward, inp.source) == (
        "session",
        "sess_x",
        "scalar",
        -0.5,
        "user",
    )


def test_a_client_rates_only_as_a_user_in_its_own_key_namespace():
    """Issue 36, finding 4: every source but user is the system's (any FeedbackSource,
    today's and later ones): a client naming one gets a 403 naming the field. A client's
    idempotency key is stored in the clients' namespace, so it can never equal one the
    worker writes (``verifier:<name>:<session>``)."""
    from core.feedback_rules import CLIENT_KEY_PREFIX, check_system_key
    from schemas.atdp import FeedbackSource

    system = [s.value for s in FeedbackSource if s.value != "user"]
    assert {"verifier", "judge", "system"} <= set(system)
    for source in system:
        with pytest.raises(APIError) as e:
            parse_feedback({"session_id": "s", "value": 1, "source": source})
        assert e.value.status == 403 and e.value.param == "source", source
        assert "user" in e.value.message
    forged = parse_feedback({"session_id": "s", "value": 1, "idempotency_key": "verifier:c:s"})
    assert forged.idempotency_key == CLIENT_KEY_PREFIX + "verifier:c:s"
    assert parse_feedback({"session_id": "s", "value": 1}).idempotency_key is None
    with pytest.raises(ValueError):  # the worker never writes into the clients' namespace
        check_system_key("verifier", CLIENT_KEY_PREFIX + "x")


def test_same_meaning_same_hash():
    a = parse_feedback({"session_id": "s", "value": 1, "scale": "binary", "idempotency_key": "k"})
    b = parse_feedback({"idempotency_key": "k", "scale": "binary", "value": 1, "session_id": "s"})
    c = parse_feedback({"idempotency_key": "k", "scale": "binary", "value": 0, "session_id": "s"})
    d = parse_feedback(
        {"idempotency_key": "k", "scale": "binary", "value": "up", "session_id": "s"}
    )
    assert a.request_hash == b.request_hash == d.request_hash != c.request_hash


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"value": 1},
        {"interaction_id": "a", "session_id": "b", "value": 1},
        {"interaction_id": "a"},
        {"interaction_id": "a", "value": 1, "sorce": "user"},
        {"interaction_id": "a", "value": 1, "source": "robot"},
        {"interaction_id": 5, "value": 1},
        {"interaction_id": "a", "value": 1, "comment": 3},
    ],
)
def test_bad_bodies_are_400(body):
    with pytest.raises(APIError) as e:
        parse_feedback(body)
    assert e.value.status == 400


def test_close_session_on_first_session_rating(migrated_db):
    """settings["close_session_on_rating"]: the first session rating closes the session
    (and settles credit); interaction ratings do not close it."""
    from core.feedback import Scope
    from core.keys import ensure_project
    from gateway.routes.feedback import submit_feedback
    from schemas.coltypes import utcnow
    from schemas.convert import to_row
    from schemas.tables import InteractionRow, SessionRow
    from tests.rows import interaction, session

    now = utcnow()
    with migrated_db() as db, db.begin():
        ensure_project(db, "p1").settings = {
            "close_session_on_rating": True,
            "credit_assignment": {"unrated": "wait", "gamma": 0.5},
        }
        db.add(to_row(session("s1", at=now)))
        db.flush()
        for k in range(2):
            answer = interaction(
                f"i{k}", "s1", k, "x", request={}, completion_logprobs=[-1.0], start=now
            )
            db.add(to_row(answer))
    scope = Scope("p1")
    submit_feedback(migrated_db, parse_feedback({"interaction_id": "i1", "value": 1}), scope=scope)
    with migrated_db() as db:
        assert db.get(SessionRow, "s1").status == "open"
        assert db.get(InteractionRow, "i0").reward is None  # wait: the session is open
    fb, replayed = submit_feedback(
        migrated_db, parse_feedback({"session_id": "s1", "value": 0.0}), scope=scope
    )
    assert not replayed and fb["reward"] == -1.0
    with migrated_db() as db:
        assert db.get(SessionRow, "s1").status == "closed"
        assert db.get(SessionRow, "s1").closed_at is not None
        assert db.get(InteractionRow, "i1").reward == 1.0  # interaction rating wins
        assert db.get(InteractionRow, "i0").reward == -0.5  # gamma**1 * -1
