"""Credit assignment on a real database (SQLite and PostgreSQL), with hand-computed rewards."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from core.keys import ensure_project
from schemas.atdp import Feedback
from schemas.convert import to_row
from schemas.tables import FeedbackRow, InteractionRow, ProjectRow, SessionRow
from tests.rows import T0, interaction, session
from trainer.credit import CreditConfig, assign_rewards, assign_rewards_tx

_n = {"fb": 0}


def _project(db, pid="p1", credit=None, **settings):  # type: ignore[no-untyped-def]
    row = ensure_project(db, pid)
    if credit is not None:
        settings["credit_assignment"] = credit
    row.settings = settings
    return row


def _session(db, sid, pid="p1", status="open"):  # type: ignore[no-untyped-def]
    db.add(to_row(session(sid, pid, status=status)))
    db.flush()


def _interaction(db, iid, sid, seq, pid="p1", group_id=None, choice=0):  # type: ignore[no-untyped-def]
    """A one-token answer to a two-token prompt."""
    answer = interaction(
        iid,
        sid,
        seq,
        project_id=pid,
        group_id=group_id,
        choice_index=choice,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_logprobs=[-0.5],
        usage={"prompt_tokens": 2, "completion_tokens": 1},
    )
    db.add(to_row(answer))


def _fb(db, target_type, target_id, sid, reward, rater=None, source="user", pid="p1"):  # type: ignore[no-untyped-def]
    _n["fb"] += 1
    db.add(
        to_row(
            Feedback(
                id=f"fb_{_n['fb']:04d}",
                project_id=pid,
                target_type=target_type,
                target_id=target_id,
                session_id=sid,
                value=reward,
                scale="scalar",
                scale_min=-1,
                scale_max=1,
                reward=reward,
                source=source,
                rater=rater,
                created_at=T0 + timedelta(seconds=100 + _n["fb"]),
            )
        )
    )


def _rewards(factory, sid):  # type: ignore[no-untyped-def]
    with factory() as db:
        rows = db.execute(
            select(InteractionRow.id, InteractionRow.reward)
            .where(InteractionRow.session_id == sid)
            .order_by(InteractionRow.seq)
        ).all()
    return {i: r for i, r in rows}


def _four_turns(db, sid="s1"):  # type: ignore[no-untyped-def]
    _session(db, sid)
    for k in range(4):
        _interaction(db, f"{sid}-t{k}", sid, k)


def test_session_rating_flows_back_with_gamma_0_9(migrated_db):
    with migrated_db() as db, db.begin():
        _project(db, credit={"gamma": 0.9})
        _four_turns(db)
        _fb(db, "session", "s1", "s1", 1.0)
    with migrated_db() as db, db.begin():
        assert assign_rewards(db, "p1") == 4
    got = _rewards(migrated_db, "s1")
    # turn k from the end gets gamma**k * r
    assert got == pytest.approx({"s1-t3": 1.0, "s1-t2": 0.9, "s1-t1": 0.81, "s1-t0": 0.729})


def test_interaction_rating_wins_over_session_rating(migrated_db):
    with migrated_db() as db, db.begin():
        _project(db, credit={"gamma": 0.9})
        _four_turns(db)
        _fb(db, "session", "s1", "s1", -0.5)
        _fb(db, "interaction", "s1-t1", "s1", 1.0)
    assign_rewards_tx(migrated_db, "p1", "s1")
    got = _rewards(migrated_db, "s1")
    assert got == pytest.approx({"s1-t3": -0.5, "s1-t2": -0.45, "s1-t1": 1.0, "s1-t0": -0.3645})


def test_repeated_ratings_latest_per_rater_then_mean(migrated_db):
    with migrated_db() as db, db.begin():
        _project(db)
        _session(db, "s1")
        _interaction(db, "a", "s1", 0)
        _fb(db, "interaction", "a", "s1", 1.0, rater="alice")
        _fb(db, "interaction", "a", "s1", -1.0, rater="alice")  # alice changed her mind
        _fb(db, "interaction", "a", "s1", 0.5, rater="bob")
        _fb(db, "interaction", "a", "s1", 1.0, rater="exact_number", source="verifier")
    assign_rewards_tx(migrated_db, "p1")
    # alice -1 (latest), bob 0.5, verifier 1 -> mean 1/6
    assert _rewards(migrated_db, "s1")["a"] == pytest.approx((-1.0 + 0.5 + 1.0) / 3)


def test_group_rating_rewards_every_member_and_member_rating_wins(migrated_db):
    with migrated_db() as db, db.begin():
        _project(db, credit={"gamma": 0.5})
        _session(db, "s1")
        _interaction(db, "first", "s1", 0)
        for c in range(3):
            _interaction(db, f"g.{c}", "s1", 1 + c, group_id="g", choice=c)
        _fb(db, "group", "g", "s1", 0.5)
        _fb(db, "interaction", "g.2", "s1", -1.0)
        _fb(db, "session", "s1", "s1", 1.0)
    assign_rewards_tx(migrated_db, "p1", "s1")
    got = _rewards(migrated_db, "s1")
    # the group is the last turn (k=0); 'first' is one turn earlier: 0.5**1 * 1.0
    assert got == pytest.approx({"first": 0.5, "g.0": 0.5, "g.1": 0.5, "g.2": -1.0})


@pytest.mark.parametrize(
    ("policy", "open_expect", "closed_expect"),
    [("skip", None, None), ("zero", 0.0, 0.0), ("wait", None, 0.0)],
)
def test_unrated_policies(migrated_db, policy, open_expect, closed_expect):
    with migrated_db() as db, db.begin():
        _project(db, credit={"unrated": policy})
        _session(db, "s1")
        _interaction(db, "rated", "s1", 0)
        _interaction(db, "unrated", "s1", 1)
        _fb(db, "interaction", "rated", "s1", 0.5)
    assign_rewards_tx(migrated_db, "p1")
    got = _rewards(migrated_db, "s1")
    assert got["rated"] == 0.5
    assert got["unrated"] == open_expect
    with migrated_db() as db, db.begin():
        db.get(SessionRow, "s1").status = "expired"
    assign_rewards_tx(migrated_db, "p1", "s1")
    got = _rewards(migrated_db, "s1")
    assert got["rated"] == 0.5
    assert got["unrated"] == closed_expect


def test_idempotent_and_consumed_rows_are_never_changed(migrated_db):
    with migrated_db() as db, db.begin():
        _project(db, credit={"gamma": 0.9})
        _four_turns(db)
        _fb(db, "session", "s1", "s1", 1.0)
    assert assign_rewards_tx(migrated_db, "p1") == 4
    assert assign_rewards_tx(migrated_db, "p1") == 0  # nothing changes the second time
    with migrated_db() as db, db.begin():
        db.get(InteractionRow, "s1-t3").consumed_by_run_id = "run_1"
        _fb(db, "session", "s1", "s1", -1.0)  # same rater (no rater, no key): replaces
    assert assign_rewards_tx(migrated_db, "p1") == 3
    got = _rewards(migrated_db, "s1")
    assert got == pytest.approx({"s1-t3": 1.0, "s1-t2": -0.9, "s1-t1": -0.81, "s1-t0": -0.729})


def test_projects_are_separate_and_default_gamma_is_one(migrated_db):
    with migrated_db() as db, db.begin():
        _project(db, "p1")
        _project(db, "p2", credit={"gamma": 0.0})
        for pid in ("p1", "p2"):
            _session(db, f"{pid}-s", pid)
            for k in range(3):
                _interaction(db, f"{pid}-{k}", f"{pid}-s", k, pid=pid)
            _fb(db, "session", f"{pid}-s", f"{pid}-s", 0.5, pid=pid)
    assign_rewards_tx(migrated_db, "p1")
    assert set(_rewards(migrated_db, "p1-s").values()) == {0.5}
    assert set(_rewards(migrated_db, "p2-s").values()) == {None}
    with migrated_db() as db, db.begin():
        assert assign_rewards(db, "p1", "p2-s") == 0  # a session of another project
        assign_rewards(db, "p2")
    assert list(_rewards(migrated_db, "p2-s").values()) == [0.0, 0.0, 0.5]


def test_config_parsing():
    assert CreditConfig.parse(None) == CreditConfig(1.0, "skip")
    assert CreditConfig.parse({"gamma": 0.9, "unrated": "wait"}) == CreditConfig(0.9, "wait")
    for bad in ({"gamma": 1.5}, {"gamma": "x"}, {"unrated": "later"}, []):
        with pytest.raises(ValueError):
            CreditConfig.parse(bad)
    assert CreditConfig.of_project({"credit_assignment": {"gamma": 2}}) == CreditConfig()
    assert ProjectRow  # the table the settings live in
    assert FeedbackRow
