"""One training run, from claiming it to committing the version and its first publish.

Run states: ``running`` (claimed, heartbeating) -> ``trained-not-published`` (adapter on
disk, PolicyVersion ``candidate`` written, interactions consumed, all in one transaction)
-> ``published`` (loaded into every engine and made ``serving``). A crash before the
commit leaves nothing consumed or published (the run is marked failed, by the worker or
by the next claimer's takeover); an engine that refuses the adapter leaves the run
``trained-not-published`` with the error, and ``retry_publish`` (every beat tick) tries
again. Before a run claims, the guards (trainer/guards.py) judge the serving version; a
trip rolls back to the best earlier version, and the run then warm-starts from it.
What triggers a run is in trainer/triggers.py; the operations on versions (publish,
retry_publish, serve_version, list_versions) in trainer/serving_switch.py, which reaches the
engines and the eval gate through trainer/publish.py. Callers import those from there.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import traceback
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from core.keys import new_id
from core.serving_version import serving_version, serving_versions
from core.settings import Settings, get_settings
from schemas.atdp import PolicyStatus, RunStatus
from schemas.coltypes import utcnow
from schemas.tables import (
    InteractionRow,
    PolicyVersionRow,
    ProjectRow,
    RunHintRow,
    TrainingRunRow,
)
from trainer import guards, runs, trackers
from trainer.advantages import Baselines, compute_advantages
from trainer.config import TrainConfig, TrainConfigError
from trainer.data import Sample, select_samples
from trainer.hints import Hint, Placer, attach
from trainer.metrics import SUMMARY_KEYS
from trainer.serving_switch import db_factory, project_config, publish_version
from trainer.tracking import Tracking

log = logging.getLogger("rlgate.trainer")
# a run looks at up to this many x max_samples rows, so that zero-variance groups (dropped)
# do not take the places of groups that carry signal (compute_advantages' max_kept)
SELECT_FACTOR = 4
STATE_KEY = "trainer_state"  # Project.settings[STATE_KEY]["baselines"]


def adapter_name(project_id: str, version: int) -> str:
    return f"{project_id}-policy-v{version}"


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
    try:
        with factory() as db:
            project, cfg = project_config(db, project_id)
            paused = project.training_paused
    except TrainConfigError as e:  # stored settings that do not validate: nothing runs
        if run_id:
            runs.finish(factory, run_id, RunStatus.failed, f"training settings invalid: {e}")
        return {
            "status": RunStatus.failed,
            "run_id": run_id,
            "error": f"training settings invalid: {e}",
        }
    if paused and trigger != "manual":
        if run_id:
            runs.finish(factory, run_id, RunStatus.cancelled, "training is paused for this project")
        return {"status": "skipped", "reason": "training paused"}
    guard = check_guards(factory, settings, project_id)
    run_id, reason = runs.claim(
        factory, project_id, trigger, cfg.snapshot(), cfg.stale_after_s, run_id
    )
    if run_id is None:
        log.info("project %s: not training: %s", project_id, reason)
        return {"status": "skipped", "reason": reason}
    log.info("project %s: run %s (%s) started", project_id, run_id, trigger)
    tracking = trackers.start_run(factory, settings, project_id, run_id, trigger, cfg)
    try:
        return _run_claimed(factory, settings, project_id, run_id, cfg, progress, guard, tracking)
    finally:
        trackers.finish_run(factory, tracking, run_id)


def _run_claimed(
    factory: sessionmaker[Session],
    settings: Settings,
    project_id: str,
    run_id: str,
    cfg: TrainConfig,
    progress: bool,
    guard: dict[str, Any] | None,
    tracking: Tracking,
) -> dict[str, Any]:
    """Train the claimed run, commit it and publish it."""
    try:
        with runs.Heartbeat(factory, run_id, cfg.heartbeat_s):
            outcome = _train_and_commit(
                factory, settings, project_id, run_id, cfg, progress, guard, tracking
            )
    except Exception as e:
        log.error("run %s failed:\n%s", run_id, traceback.format_exc())
        _fail_if_ours(factory, run_id, f"{type(e).__name__}: {e}")
        return {"status": RunStatus.failed, "run_id": run_id, "error": str(e)}
    if outcome.get("policy_version_id"):
        outcome["published"] = publish_version(factory, settings, outcome["policy_version_id"])
        with factory() as db:
            outcome["status"] = db.get(TrainingRunRow, run_id).status  # type: ignore[union-attr]
    return {"run_id": run_id, **outcome, **({"guard": guard} if guard else {})}


def guard_all(factory: sessionmaker[Session], settings: Settings) -> list[str]:
    """The beat's guard pass: every project whose serving version has a version before
    it; returns ``project:rolled-back-name`` for each rollback."""
    with factory() as db:
        ids = sorted(serving_versions(db))
    out = []
    for project_id in ids:
        trip = check_guards(factory, settings, project_id)
        if trip:
            out.append(f"{project_id}:{trip['rolled_back']}")
    return out


def check_guards(
    factory: sessionmaker[Session], settings: Settings, project_id: str
) -> dict[str, Any] | None:
    """The guards of one project; a failure to check is logged, never fatal to training."""
    try:
        return guards.enforce(factory, settings, project_id)
    except Exception:
        log.error("guards of project %s failed:\n%s", project_id, traceback.format_exc())
        return None


def _fail_if_ours(factory: sessionmaker[Session], run_id: str, error: str) -> None:
    with transaction(factory) as db:
        db.execute(
            update(TrainingRunRow)
            .where(TrainingRunRow.id == run_id, TrainingRunRow.status == runs.ACTIVE)
            .values(status=RunStatus.failed, error=error[:4000], finished_at=utcnow())
        )


def _train_and_commit(
    factory: sessionmaker[Session],
    settings: Settings,
    project_id: str,
    run_id: str,
    cfg: TrainConfig,
    progress: bool,
    guard: dict[str, Any] | None = None,
    tracking: Tracking | None = None,
) -> dict[str, Any]:
    from engine.model_files import resolve_model_dir
    from trainer.launch import FitInputs, fit
    from trainer.policy import lora_config_dict
    from trainer.shared_gpu import engines_released

    with factory() as db:
        project = db.get(ProjectRow, project_id)
        assert project is not None
        sel = select_samples(
            db,
            project_id,
            max_staleness=cfg.max_staleness,
            max_samples=cfg.max_samples * SELECT_FACTOR,
            group_by_prompt=cfg.group_by_prompt,
        )
        serving = serving_version(db, project_id)
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
        max_kept=cfg.max_samples,
    )
    n_groups = adv_stats.groups + adv_stats.dropped_zero_variance_groups
    data_stats = {
        "selected": len(sel.samples),
        "serving_version": sel.serving_version,
        **{f"skipped_{k}": v for k, v in sel.skipped.items()},
        **vars(adv_stats),
        "zero_variance_share": adv_stats.dropped_zero_variance_groups / n_groups
        if n_groups
        else 0.0,
    }
    if guard:
        data_stats["guard"] = guard
    if not sel.samples:
        runs.finish(
            factory,
            run_id,
            RunStatus.cancelled,
            f"no trainable samples ({data_stats})",
            data_stats=data_stats,
        )
        return {"status": RunStatus.cancelled, "data": data_stats}
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
            status=RunStatus.cancelled,
            error="nothing to learn: every sample is in a zero-variance group",
        )
        return {"status": RunStatus.cancelled, "data": data_stats}

    model_dir = resolve_model_dir(settings.model_path, settings.data_dir)
    warm = Path(serving.path) if (cfg.warm_start and serving and serving.path) else None
    if warm is not None and not (warm / "adapter_config.json").is_file():
        log.warning("serving adapter %s is missing on disk: fresh adapter", warm)
        warm = None
    hints = place_hints(factory, settings, model_dir, kept, cfg, data_stats)
    name = adapter_name(project_id, next_version)
    out = Path(settings.effective_adapter_dir) / project_id / name
    tmp = out.with_name(f".{name}.{run_id}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with engines_released(settings):  # a GPU shared with serving (trainer/shared_gpu.py)
        done = fit(
            FitInputs(
                str(model_dir),
                cfg,
                kept,
                str(tmp),
                str(warm) if warm else None,
                serving.version if (serving and warm) else 0,
                {"run_id": run_id, "version": next_version, "name": name},
            ),
            processes=settings.train_processes,
            backend=settings.train_backend,
            work_dir=Path(settings.data_dir) / "train-runs" / run_id,
            on_step=lambda m: _on_step(factory, run_id, m, tracking),
            progress=progress,
        )
    steps, hint_gaps = done.steps, done.hint_gaps
    data_stats["processes"] = settings.train_processes
    data_stats["run_metrics"] = run_metrics(steps, data_stats["zero_variance_share"])
    hint_rows = [
        RunHintRow(
            id=new_id("hint"),
            run_id=run_id,
            interaction_id=h.interaction_id,
            feedback_id=h.feedback_id,
            origin=h.origin,
            text=h.text,
            teacher=cfg.hint_teacher,
            adv_mean=hint_gaps.get(h.interaction_id),
            created_at=utcnow(),
        )
        for h in hints
    ]

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
        lora_config={**lora_config_dict(cfg), "warm_start": done.warm_started_from},
        created_by_run_id=run_id,
        status=PolicyStatus.candidate,
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
        status=RunStatus.trained_not_published,
        error=None,
        hints=hint_rows,
    )
    return {
        "status": RunStatus.trained_not_published,
        "policy_version_id": pv.id,
        "name": name,
        "data": data_stats,
        "steps": len(steps),
    }


def _on_step(
    factory: sessionmaker[Session], run_id: str, step: dict[str, Any], tracking: Tracking | None
) -> None:
    """Each step: onto the run's row (the dashboard's run page), then to its trackers."""
    runs.heartbeat(factory, run_id, {"step": step})
    if tracking is not None:
        tracking.step(step)


def place_hints(
    factory: sessionmaker[Session],
    settings: Settings,
    model_dir: Path,
    samples: list[Sample],
    cfg: TrainConfig,
    data_stats: dict[str, Any],
) -> list[Hint]:
    """Give the samples with a rating's words their hinted prompt (trainer/hints.py);
    counts hints placed and refused (by reason) in ``data_stats``. None with hint_weight 0."""
    if not cfg.hint_weight:
        return []
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(settings.tokenizer_path or str(model_dir))
    with factory() as db:
        hints, refused = attach(db, samples, Placer(tok))
    data_stats["hints"] = len(hints)
    data_stats.update({f"skipped_{k}": v for k, v in refused.items()})
    if hints or refused:
        log.info("hints: %d placed, refused %s", len(hints), dict(refused) or "none")
    return hints


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
    hints: list[RunHintRow] | None = None,
) -> None:
    """One transaction: the run is still ours -> version row, consumption, baselines,
    the hints its teacher saw."""
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
        db.add_all(hints or [])
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
        if status != RunStatus.trained_not_published:
            run.finished_at = utcnow()


def run_metrics(steps: list[dict[str, Any]], zero_variance_share: float) -> dict[str, Any]:
    """One run's summary: means over its steps, whether the trust region stopped it, and
    what the prefix merge saved."""
    out: dict[str, Any] = {"zero_variance_share": zero_variance_share, "steps": len(steps)}
    for key in SUMMARY_KEYS:  # trainer/metrics.py
        values = [float(s[key]) for s in steps if isinstance(s.get(key), int | float)]
        out[key] = statistics.fmean(values) if values else None
    out["stopped_early"] = any(s.get("stopped_early") for s in steps)
    # prefix merge (trainer/merge.py): turns trained inside a merged row (first epoch), and
    # tokens forwarded / saved against one row per turn by all of the run's passes
    out["merged_turns"] = sum(int(s.get("merged_turns", 0)) for s in steps if not s.get("epoch"))
    for key in ("forward_tokens", "forward_tokens_saved"):
        out[key] = sum(int(s.get(key, 0)) + int(s.get(f"no_grad_{key}", 0)) for s in steps)
    return out
