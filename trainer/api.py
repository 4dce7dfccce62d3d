"""The gateway's one door into the trainer (tests/test_imports.py): triggering and steering
training (the admin API, the CLI) and the trainer's side of ratings and closed sessions.

Importing this module is light (no torch, no Celery): the gateway imports it on its first
rating. The trainer modules behind each function are imported when it is first called.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from core.keys import audit
from core.settings import Settings
from schemas.tables import FeedbackRow
from trainer import hooks
from trainer.metrics import CHARTS
from trainer.publish import PublishError, RefusedVersion

__all__ = [
    "CHARTS",
    "PublishError",
    "RefusedVersion",
    "after_feedback",
    "check_training",
    "effective_training",
    "enqueue_next_turn",
    "judge_usage",
    "learning_curve",
    "list_adapters",
    "on_session_closed",
    "promote",
    "reads_next_turn",
    "rollback",
    "serve_version",
    "session_credit",
    "train_now",
    "update_verifiers",
    "verifier_settings",
]


# ---- ratings and sessions -------------------------------------------------------------------


def after_feedback(factory: sessionmaker[Session], row: FeedbackRow) -> None:
    """After a new feedback record: credit assignment for its session, and closing the
    session on a session rating when the project says so (trainer/hooks.py)."""
    hooks.after_feedback(factory, row)


def on_session_closed(factory: sessionmaker[Session], session_id: str) -> bool:
    """After a session was closed or expired: credit assignment and, when a verifier is
    configured, the verifier task; returns whether it enqueued. Never raises."""
    return hooks.on_session_closed(factory, session_id)


def reads_next_turn(project_settings: dict[str, Any] | None) -> bool:
    """Whether the project has a source that rates an answer by the user's next message
    (``next_turn_rules``, the judge in ``mode: next_turn``; trainer/next_turn.py)."""
    from trainer.next_turn import reads_next_turn as reads

    return reads(project_settings)


def enqueue_next_turn(session_id: str, interaction_id: str) -> None:
    """Queue the next-turn task for a committed turn that follows an earlier answer (on the
    verify queue: the worker rates that answer by the user's message, trainer/next_turn.py)."""
    hooks.enqueue_next_turn(session_id, interaction_id)


# ---- training ---------------------------------------------------------------------------------


def train_now(
    project_id: str,
    actor: str,
    *,
    factory: sessionmaker[Session] | None = None,
    queue: str | None = None,
) -> str:
    """Queue a manual run (ignores the threshold); returns its run id at once.

    The run row exists immediately with status ``queued``; a worker picks it up.
    """
    from trainer import runs
    from trainer import serving_switch as serving
    from trainer.celery_base import publisher
    from trainer.tasks import TRAIN_TASK

    factory = factory or serving.db_factory()
    run_id = runs.create_queued(factory, project_id, "manual")
    with transaction(factory) as db:
        audit(db, actor, "training.trigger", project_id, "training_run", run_id, {})
    options = {"queue": queue} if queue else {}
    publisher().send_task(TRAIN_TASK, args=(project_id, "manual", run_id), **options)
    return run_id


def effective_training(overrides: dict[str, Any]) -> dict[str, Any]:
    """The training settings a run would use with these project overrides (the snapshot a
    run records), or ``{"error": ...}`` when the stored overrides cannot work."""
    from trainer.config import TrainConfig, TrainConfigError

    try:
        return TrainConfig.from_project_settings({"training": overrides}).snapshot()
    except TrainConfigError as e:  # stored by hand and broken: say so, do not hide it
        return {"error": str(e)}


def check_training(overrides: dict[str, Any]) -> None:
    """Raise a ValueError (or TypeError) saying what is wrong unless these overrides make a
    valid TrainConfig (types, the bounds table, the eval gate's schema) whose eval gate
    names a registered verifier."""
    from trainer.config import TrainConfig
    from trainer.eval_gate import require_registered

    cfg = TrainConfig.from_project_settings({"training": overrides})
    require_registered(cfg.eval_gate)


# ---- verifiers and the judge ----------------------------------------------------------------


def _project_settings(factory: sessionmaker[Session], project_id: str) -> dict[str, Any]:
    from schemas.tables import ProjectRow

    with factory() as db:
        project = db.get(ProjectRow, project_id)
        if project is None:
            raise LookupError(f"no project {project_id!r}")
        return dict(project.settings or {})


def judge_usage(factory: sessionmaker[Session], project_id: str) -> dict[str, Any] | None:
    """The project's judge budget and what it used in the last hour (calls, known cost in
    USD, calls per outcome) and the last 24 hours (calls per outcome); None when no judge
    is configured (trainer/judge.py)."""
    from core.grants import GrantError
    from trainer.judge import settings_for, usage
    from trainer.verifiers import project_params

    settings = _project_settings(factory, project_id)
    raw = settings.get("verifiers")
    items = raw if isinstance(raw, list) else [] if raw is None else [raw]
    if not any(i == "judge" or (isinstance(i, dict) and i.get("name") == "judge") for i in items):
        return None
    params = project_params(settings, "judge")
    if not params:  # configured, but the stored spec does not validate: it never runs
        return {"error": "the stored judge spec is invalid; it does not run"}
    try:
        cfg = settings_for(params, project_id)
    except GrantError as e:
        return {"error": f"the judge does not run: {e}"}
    hour = usage(factory, project_id, 1.0)
    return {
        "judge": params.get("judge"),
        "model": cfg["model"],
        "mode": cfg["mode"],
        "calls_per_hour": cfg["calls_per_hour"],
        "seconds_per_hour": cfg["seconds_per_hour"],
        "usd_per_hour": cfg["usd_per_hour"],
        "last_hour": hour,
        "last_day": usage(factory, project_id, 24.0)["outcomes"],
    }


def verifier_settings(factory: sessionmaker[Session], project_id: str) -> dict[str, Any]:
    """The project's ``settings["verifiers"]`` and the judge's budget and usage."""
    settings = _project_settings(factory, project_id)
    return {
        "project_id": project_id,
        "verifiers": settings.get("verifiers"),
        "judge": judge_usage(factory, project_id),
    }


def update_verifiers(
    factory: sessionmaker[Session], project_id: str, verifiers: Any, actor: str
) -> dict[str, Any]:
    """Replace the project's ``settings["verifiers"]`` (None removes them) after checking
    every spec (trainer/verifier_specs.py: registered names, known and bounded parameters,
    the operator's command and judge entries granted to this project, nothing that names
    a program, URL, key or cap); a ValueError says what is wrong and nothing changes. An
    AuditEvent ``verifiers.settings``."""
    from schemas.tables import ProjectRow
    from trainer.verifiers import check_specs

    specs = check_specs(verifiers, project_id=project_id) if verifiers is not None else None
    with transaction(factory) as db:
        project = db.get(ProjectRow, project_id)
        if project is None:
            raise LookupError(f"no project {project_id!r}")
        settings = dict(project.settings or {})
        if specs is None:
            settings.pop("verifiers", None)
        else:
            settings["verifiers"] = specs
        project.settings = settings
        audit(
            db,
            actor,
            "verifiers.settings",
            project_id,
            "project",
            project_id,
            {"verifiers": specs},
        )
    return verifier_settings(factory, project_id)


def session_credit(factory: sessionmaker[Session], session_id: str) -> dict[str, Any] | None:
    """Each turn's reward, the level that decided it (interaction, group, session with its
    discount, unrated) and the ratings behind it with their origin (user, verifier, judge,
    next_turn, next_turn_rules, system), rationale and judge model (trainer/credit_view.py);
    None for an unknown session. The caller checks ``project_id`` against the caller's scope."""
    from trainer.credit_view import session_credit as explain

    return explain(factory, session_id)


def learning_curve(factory: sessionmaker[Session], project_id: str) -> list[dict[str, Any]]:
    """Per policy version: requests, rated interactions, mean reward, eval gate score."""
    from trainer.credit_view import learning_curve as curve

    return curve(factory, project_id)


# ---- adapters ---------------------------------------------------------------------------------


def serve_version(
    project_id: str,
    target: str | int,
    *,
    actor: str,
    action: str,
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    unload: bool = True,
) -> dict[str, Any]:
    """Serve a version (name, number, or ``base``: the base model) of the project; an
    AuditEvent ``action``. :class:`PublishError` when an engine refused it, LookupError
    for an unknown one, :class:`RefusedVersion` for a rejected one. ``unload`` False:
    answer once switched, ``"unloading"`` naming the replaced version (the caller unloads
    it; trainer/serving_switch.py)."""
    from trainer import serving_switch as serving

    return dict(
        serving.serve_version(
            project_id,
            target,
            actor=actor,
            action=action,
            settings=settings,
            factory=factory,
            unload=unload,
        )
    )


def rollback(project_id: str, target: str | int, actor: str) -> dict[str, Any]:
    """Re-serve an earlier version (name or number); an AuditEvent adapter.rollback."""
    from trainer import serving_switch as serving

    return serving.serve_version(project_id, target, actor=actor, action="adapter.rollback")


def promote(project_id: str, target: str | int, actor: str) -> dict[str, Any]:
    """Serve a given version (e.g. a candidate); an AuditEvent adapter.promote."""
    from trainer import serving_switch as serving

    return serving.serve_version(project_id, target, actor=actor, action="adapter.promote")


def list_adapters(project_id: str | None = None) -> list[dict[str, Any]]:
    from trainer import serving_switch as serving

    return serving.list_versions(project_id)
