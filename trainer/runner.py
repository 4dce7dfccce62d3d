"""One training run from start to publish, and the other operations on versions.

Run states: ``running`` (claimed, heartbeating) -> ``trained-not-published`` (adapter on
disk, PolicyVersion ``candidate`` written, interactions consumed, all in one transaction)
-> ``published`` (loaded into every engine and made ``serving``). A crash before the
commit leaves nothing consumed or published (the run is marked failed, by the worker or
by the next claimer's takeover); an engine that refuses the adapter leaves the run
``trained-not-published`` with the error, and ``retry_publish`` (every beat tick) tries
again.
"""

from __future__ import annotations

import logging
import shutil
import traceback
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import make_engine, session_factory, transaction
from gateway.keys import audit, new_id
from gateway.settings import Settings, get_settings
from schemas.coltypes import utcnow
from schemas.tables import InteractionRow, PolicyVersionRow, ProjectRow, TrainingRunRow
from trainer import publish, runs
from trainer.advantages import Baselines, compute_advantages
from trainer.config import TrainConfig
from trainer.data import count_trainable, select_samples

log = logging.getLogger("rlgate.trainer")
STATE_KEY = "trainer_state"  # Project.settings[STATE_KEY]["baselines"]


@lru_cache(maxsize=8)
def _factory_for(url: str) -> sessionmaker[Session]:
    return session_factory(make_engine(url))


def db_factory(settings: Settings | None = None) -> sessionmaker[Session]:
    return _factory_for((settings or get_settings()).effective_database_url)


def adapter_name(project_id: str, version: int) -> str:
    return f"{project_id}-policy-v{version}"


def project_config(db: Session, project_id: str) -> tuple[ProjectRow, TrainConfig]:
    project = db.get(ProjectRow, project_id)
    if project is None:
        raise LookupError(f"no project {project_id!r}")
    return project, TrainConfig.from_project_settings(project.settings)


def _serving(db: Session, project_id: str) -> PolicyVersionRow | None:
    return db.scalars(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.project_id == project_id, PolicyVersionRow.status == "serving")
        .order_by(PolicyVersionRow.version.desc())
    ).first()


# ---- training ----------------------------------------------------------------------


def run_training(
    project_id: str,
    trigger: str = "manual",
    run_id: str | None = None,
    *,
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train one run of ``project_id`` and publish it. Safe to call again with the same
    ``run_id`` (a finished run is not redone). Never raises for a failed run: the result
    and the run row say what happened."""
    settings = settings or get_settings()
    factory = factory or db_factory(settings)
    with factory() as db:
        project, cfg = project_config(db, project_id)
        paused = project.training_paused
    if paused and trigger != "manual":
        if run_id:
            runs.finish(factory, run_id, "cancelled", "training is paused for this project")
        return {"status": "skipped", "reason": "training paused"}
    run_id, reason = runs.claim(
        factory, project_id, trigger, cfg.snapshot(), cfg.stale_after_s, run_id
    )
    if run_id is None:
        log.info("project %s: not training: %s", project_id, reason)
        return {"status": "skipped", "reason": reason}
    log.info("project %s: run %s (%s) started", project_id, run_id, trigger)
    try:
        with runs.Heartbeat(factory, run_id, cfg.heartbeat_s):
            outcome = _train_and_commit(factory, settings, project_id, run_id, cfg, progress)
    except Exception as e:
        log.error("run %s failed:\n%s", run_id, traceback.format_exc())
        _fail_if_ours(factory, run_id, f"{type(e).__name__}: {e}")
        return {"status": "failed", "run_id": run_id, "error": str(e)}
    if outcome.get("policy_version_id"):
        outcome["published"] = publish_version(factory, settings, outcome["policy_version_id"])
        with factory() as db:
            outcome["status"] = db.get(TrainingRunRow, run_id).status  # type: ignore[union-attr]
    return {"run_id": run_id, **outcome}


def _fail_if_ours(factory: sessionmaker[Session], run_id: str, error: str) -> None:
    with transaction(factory) as db:
        db.execute(
            update(TrainingRunRow)
            .where(TrainingRunRow.id == run_id, TrainingRunRow.status == runs.ACTIVE)
            .values(status="failed", error=error[:4000], finished_at=utcnow())
        )


def _train_and_commit(
    factory: sessionmaker[Session],
    settings: Settings,
    project_id: str,
    run_id: str,
    cfg: TrainConfig,
    progress: bool,
) -> dict[str, Any]:
    from engine.model_files import resolve_model_dir
    from trainer.policy import Policy, lora_config_dict
    from trainer.train import train

    with factory() as db:
        project = db.get(ProjectRow, project_id)
        assert project is not None
        sel = select_samples(
            db,
            project_id,
            max_staleness=cfg.max_staleness,
            max_samples=cfg.max_samples,
            group_by_prompt=cfg.group_by_prompt,
        )
        serving = _serving(db, project_id)
        next_version = 1 + int(
            db.scalar(
                select(func.max(PolicyVersionRow.version)).where(
                    PolicyVersionRow.project_id == project_id
                )
            )
            or 0
        )
        state = dict((project.settings or {}).get(STATE_KEY) or {})
    baselines = Baselines(dict(state.get("baselines") or {}))
    kept, dropped, adv_stats = compute_advantages(
        sel.samples,
        baselines,
        std_normalize=cfg.std_normalize,
        leave_one_out=cfg.leave_one_out,
        baseline_alpha=cfg.baseline_alpha,
    )
    data_stats = {
        "selected": len(sel.samples),
        "serving_version": sel.serving_version,
        **{f"skipped_{k}": v for k, v in sel.skipped.items()},
        **vars(adv_stats),
    }
    if not sel.samples:
        runs.finish(factory, run_id, "cancelled", f"no trainable samples ({data_stats})")
        return {"status": "cancelled", "data": data_stats}
    if not kept:  # only zero-variance groups: consume them (they carry no signal)
        _commit(
            factory,
            project_id,
            run_id,
            [s.interaction_id for s in dropped],
            baselines,
            data_stats,
            [],
            None,
            status="cancelled",
            error="nothing to learn: every sample is in a zero-variance group",
        )
        return {"status": "cancelled", "data": data_stats}

    model_dir = resolve_model_dir(settings.model_path, settings.data_dir)
    warm = Path(serving.path) if (cfg.warm_start and serving and serving.path) else None
    if warm is not None and not (warm / "adapter_config.json").is_file():
        log.warning("serving adapter %s is missing on disk: fresh adapter", warm)
        warm = None
    policy = Policy.load(model_dir, cfg, warm)
    opt = policy.make_optimizer(cfg, warm)
    steps = train(
        policy,
        opt,
        kept,
        cfg,
        progress=progress,
        on_step=lambda m: runs.heartbeat(factory, run_id, {"step": m}),
    )

    name = adapter_name(project_id, next_version)
    out = Path(settings.data_dir) / "adapters" / project_id / name
    tmp = out.with_name(f".{name}.{run_id}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    policy.save(tmp, opt, {"run_id": run_id, "version": next_version, "name": name})
    if out.exists():  # left by a run that crashed before its commit
        shutil.rmtree(out)
    tmp.rename(out)
    pv = PolicyVersionRow(
        id=new_id("pv"),
        project_id=project_id,
        name=name,
        version=next_version,
        parent_name=serving.name if serving else None,
        base_model=settings.model_path,
        path=str(out.resolve()),
        lora_config={**lora_config_dict(cfg), "warm_start": policy.warm_started_from},
        created_by_run_id=run_id,
        status="candidate",
        created_at=utcnow(),
    )
    ids = [s.interaction_id for s in kept] + [s.interaction_id for s in dropped]
    _commit(
        factory,
        project_id,
        run_id,
        ids,
        baselines,
        data_stats,
        steps,
        pv,
        status="trained-not-published",
        error=None,
    )
    return {
        "status": "trained-not-published",
        "policy_version_id": pv.id,
        "name": name,
        "data": data_stats,
        "steps": len(steps),
    }


def _commit(
    factory: sessionmaker[Session],
    project_id: str,
    run_id: str,
    interaction_ids: list[str],
    baselines: Baselines,
    data_stats: dict[str, Any],
    steps: list[dict[str, Any]],
    pv: PolicyVersionRow | None,
    *,
    status: str,
    error: str | None,
) -> None:
    """One transaction: the run is still ours -> version row, consumption, baselines."""
    with transaction(factory) as db:
        project = runs.lock_project(db, project_id)
        run = db.get(TrainingRunRow, run_id)
        if (
            project is None
            or run is None
            or run.status != runs.ACTIVE
            or run.config.get("worker") != runs.worker_id()
        ):
            raise RuntimeError(f"run {run_id} was taken over; its result is discarded")
        if pv is not None:
            db.add(pv)
            db.flush()
        if interaction_ids:
            res = db.execute(
                update(InteractionRow)
                .where(
                    InteractionRow.id.in_(interaction_ids),
                    InteractionRow.consumed_by_run_id.is_(None),
                )
                .values(consumed_by_run_id=run_id)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != len(interaction_ids):
                raise RuntimeError("some samples were consumed by another run meanwhile")
        settings = dict(project.settings or {})
        settings[STATE_KEY] = {**dict(settings.get(STATE_KEY) or {}), "baselines": baselines.values}
        project.settings = settings
        run.status = status
        run.error = error
        run.num_samples = len(interaction_ids)
        run.step_metrics = steps
        run.policy_version_id = pv.id if pv is not None else None
        run.config = {**run.config, "data_stats": data_stats}
        if status != "trained-not-published":
            run.finished_at = utcnow()


# ---- publishing --------------------------------------------------------------------


def publish_version(
    factory: sessionmaker[Session], settings: Settings, version_id: str, actor: str = "system"
) -> bool:
    """Load a candidate everywhere, gate it, make it serving, unload the old one."""
    urls = settings.engine_url_list
    with factory() as db:
        pv = db.get(PolicyVersionRow, version_id)
        if pv is None or pv.status != "candidate":
            return False
        _, cfg = project_config(db, pv.project_id)
        serving = _serving(db, pv.project_id)
        serving_name = serving.name if serving else None
        project_id, name, path, run_id = pv.project_id, pv.name, pv.path, pv.created_by_run_id
    try:
        publish.load_everywhere(urls, name, path)
        ok, metrics = publish.eval_gate(urls[0], name, serving_name, cfg.eval_gate)
        if metrics:
            with transaction(factory) as db:
                db.get(PolicyVersionRow, version_id).eval_metrics = metrics  # type: ignore[union-attr]
        if not ok:
            with transaction(factory) as db:
                db.get(PolicyVersionRow, version_id).status = "rejected"  # type: ignore[union-attr]
                audit(
                    db,
                    actor,
                    "adapter.reject",
                    project_id,
                    "policy_version",
                    version_id,
                    {"name": name, **metrics},
                )
            if run_id:
                runs.finish(
                    factory,
                    run_id,
                    "trained-not-published",
                    f"eval gate rejected {name}: {metrics}",
                )
            publish.unload_everywhere(urls, name)
            return False
        previous = publish.switch_serving(
            factory,
            project_id,
            version_id,
            actor=actor,
            action="adapter.promote",
            run_id=run_id,
            require_newer=True,
        )
    except Exception as e:  # engine down or refusing: retried by the next tick
        log.warning("publishing %s failed: %s", name, e)
        if run_id:
            runs.finish(factory, run_id, "trained-not-published", f"publish failed: {e}")
        return False
    log.info("project %s: %s is serving (was %s)", project_id, name, previous)
    if previous and previous != name:
        publish.unload_everywhere(urls, previous)
    return True


def retry_publish(
    settings: Settings | None = None, factory: sessionmaker[Session] | None = None
) -> list[str]:
    """Publish candidates whose run trained but could not publish (newest per project)."""
    settings = settings or get_settings()
    factory = factory or db_factory(settings)
    with factory() as db:
        rows = db.execute(
            select(PolicyVersionRow.id, PolicyVersionRow.project_id, PolicyVersionRow.version)
            .join(TrainingRunRow, TrainingRunRow.id == PolicyVersionRow.created_by_run_id)
            .where(
                PolicyVersionRow.status == "candidate",
                TrainingRunRow.status == "trained-not-published",
            )
            .order_by(PolicyVersionRow.version.desc())
        ).all()
        serving = {
            pid: v
            for pid, v in db.execute(
                select(PolicyVersionRow.project_id, func.max(PolicyVersionRow.version))
                .where(PolicyVersionRow.status == "serving")
                .group_by(PolicyVersionRow.project_id)
            ).all()
        }
    done, seen = [], set()
    for vid, pid, version in rows:
        if pid in seen or version <= serving.get(pid, 0):
            continue
        seen.add(pid)
        if publish_version(factory, settings, vid):
            done.append(vid)
    return done


def serve_version(
    project_id: str,
    target: str | int,
    *,
    actor: str = "cli",
    action: str = "adapter.rollback",
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
) -> dict[str, Any]:
    """Re-serve an earlier (or any) version: load it if needed, switch the pointer,
    unload the one it replaces. ``target`` is a name or a version number."""
    settings = settings or get_settings()
    factory = factory or db_factory(settings)
    with factory() as db:
        q = select(PolicyVersionRow).where(PolicyVersionRow.project_id == project_id)
        if isinstance(target, int) or str(target).isdigit():
            q = q.where(PolicyVersionRow.version == int(target))
        else:
            q = q.where(PolicyVersionRow.name == str(target))
        pv = db.scalars(q).first()
        if pv is None:
            raise LookupError(f"no version {target!r} in project {project_id!r}")
        vid, name, path, status = pv.id, pv.name, pv.path, pv.status
    if status == "serving":
        return {"name": name, "previous": None, "changed": False}
    publish.load_everywhere(settings.engine_url_list, name, path)
    previous = publish.switch_serving(factory, project_id, vid, actor=actor, action=action)
    if previous and previous != name:
        publish.unload_everywhere(settings.engine_url_list, previous)
    return {"name": name, "previous": previous, "changed": True}


def list_versions(
    project_id: str | None = None, factory: sessionmaker[Session] | None = None
) -> list[dict[str, Any]]:
    factory = factory or db_factory()
    with factory() as db:
        q = select(PolicyVersionRow).order_by(PolicyVersionRow.project_id, PolicyVersionRow.version)
        if project_id:
            q = q.where(PolicyVersionRow.project_id == project_id)
        return [
            {
                "project": r.project_id,
                "name": r.name,
                "version": r.version,
                "status": r.status,
                "parent": r.parent_name,
                "run": r.created_by_run_id,
                "created_at": r.created_at.isoformat() if r.created_at else None,
                "promoted_at": r.promoted_at.isoformat() if r.promoted_at else None,
                "path": r.path,
                "eval_metrics": r.eval_metrics,
            }
            for r in db.scalars(q)
        ]


# ---- triggers ------------------------------------------------------------------------


def due_trigger(db: Session, project: ProjectRow, cfg: TrainConfig) -> str | None:
    """'threshold' if >= threshold fresh samples wait, 'schedule' if the schedule is due
    and >= min_samples wait, else None."""
    if project.training_paused:
        return None
    n = count_trainable(db, project.id, cfg.max_staleness)
    if n >= max(cfg.threshold, 1):
        return "threshold"
    if n < max(cfg.min_samples, 1):
        return None
    last = db.scalar(
        select(func.max(TrainingRunRow.created_at)).where(
            TrainingRunRow.project_id == project.id,
            TrainingRunRow.status.in_(("running", "published", "trained-not-published")),
        )
    )
    if last is None:
        return "schedule"
    now = utcnow()
    if last.tzinfo is None:
        last = last.replace(tzinfo=now.tzinfo)
    return "schedule" if now - last >= timedelta(minutes=cfg.schedule_minutes) else None


def due_projects(factory: sessionmaker[Session]) -> list[tuple[str, str]]:
    out = []
    with factory() as db:
        for project in db.scalars(select(ProjectRow)):
            try:
                cfg = TrainConfig.from_project_settings(project.settings)
            except ValueError as e:
                log.warning("project %s: %s", project.id, e)
                continue
            trigger = due_trigger(db, project, cfg)
            if trigger:
                out.append((project.id, trigger))
    return out
