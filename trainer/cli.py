"""Click commands of the trainer; ``rlgate/cli.py`` registers them on ``rlgate``:
``worker_command`` (``rlgate worker``), ``train_command`` (``rlgate train``),
``adapters_group`` (``rlgate adapters list|rollback|promote``)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import subprocess
import sys

import click

from core.logs import configure as configure_logging
from core.settings import get_settings


@click.command("worker")
@click.option("--beat", is_flag=True, help="Also run the beat scheduler (periodic training).")
@click.option("--concurrency", "-c", type=int, default=1, show_default=True)
@click.option("--pool", default="solo", show_default=True, help="Celery pool (solo, prefork).")
@click.option(
    "--queues",
    "-Q",
    default="",
    help="Comma-separated queues (default: celery, the trainer's; with --queues no verify "
    "pool is started, so name rlgate.verify on some worker).",
)
@click.option(
    "--verify-workers",
    type=int,
    default=None,
    help="Processes of the verify pool started beside this worker (queue rlgate.verify, "
    "prefork, hard time limit). Default: RLGATE_VERIFY_WORKERS (2); 0: none.",
)
@click.option("--loglevel", "-l", default=None, help="Default: settings log_level.")
@click.option(
    "--hostname",
    "-n",
    default=None,
    help="Celery node name (default celery@<host>); give each worker on a host its own.",
)
def worker_command(
    beat: bool,
    concurrency: int,
    pool: str,
    queues: str,
    loglevel: str | None,
    hostname: str | None,
    verify_workers: int | None,
):
    """Run a Celery worker that trains (the broker comes from the settings), and beside it
    the verify pool: verifiers and judges run there, so they never hold up training."""
    from trainer.celery_app import app

    settings = get_settings()
    level = loglevel or settings.log_level
    configure_logging(level)
    argv = [
        "worker",
        f"--loglevel={level.upper()}",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
    ]
    if queues:
        argv.append(f"--queues={queues}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    if beat:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        argv += ["--beat", f"--schedule={settings.data_dir / 'celerybeat-schedule'}"]
    n = settings.verify_workers if verify_workers is None else verify_workers
    pool = None if queues or n < 1 else _start_verify_pool(n, level, hostname)
    try:
        app.worker_main(argv)
    finally:
        if pool is not None:
            pool.terminate()
            try:
                pool.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pool.kill()


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent stops it
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _start_verify_pool(n: int, level: str, hostname: str | None) -> subprocess.Popen[bytes]:
    """A prefork Celery worker on the verify queue (prefork enforces the hard time limit
    by killing the process), stopped with this one."""
    from trainer.hooks import VERIFY_QUEUE

    node = f"verify-{hostname}" if hostname else "verify@%h"
    argv = [
        sys.executable, "-m", "celery", "-A", "trainer.celery_app", "worker",
        f"--queues={VERIFY_QUEUE}", "--pool=prefork", f"--concurrency={n}",
        f"--loglevel={level.upper()}", f"--hostname={node}",
    ]  # fmt: skip
    click.echo(f"verify pool: {n} process(es) on queue {VERIFY_QUEUE} ({node})", err=True)
    return subprocess.Popen(argv, preexec_fn=_die_with_parent)  # noqa: PLW1509


@click.command("train")
@click.option("--once", is_flag=True, help="Train now in this process and exit.")
@click.option(
    "--project",
    "-p",
    "projects",
    multiple=True,
    help="Project id (repeatable); default: every project with samples.",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
def train_command(once: bool, projects: tuple[str, ...], progress: bool) -> None:
    """Train on the rated samples waiting now (ignores the threshold).

    With --once the run happens here, and the command exits 1 when a run failed or was
    trained but not published (the engine refused or could not be reached; a worker
    retries the publish); without it, the run is queued for a worker.
    """
    from sqlalchemy import select

    from schemas.atdp import RunStatus
    from schemas.tables import ProjectRow
    from trainer import api, runner, serving_switch

    settings = get_settings()
    configure_logging(settings.log_level)
    _stack_database()
    factory = serving_switch.db_factory(settings)
    if not projects:
        with factory() as db:
            projects = tuple(db.scalars(select(ProjectRow.id).order_by(ProjectRow.id)))
    failed = False
    for project_id in projects:
        if once:
            result = runner.run_training(
                project_id, "manual", settings=settings, factory=factory, progress=progress
            )
            # trained but not published (no engine took it) is not done: exit 1 with the
            # reason in the JSON line; the worker's retry_publish tries it again
            failed |= result.get("status") in (RunStatus.failed, RunStatus.trained_not_published)
        else:
            result = {
                "run_id": api.train_now(project_id, "cli", factory=factory),
                "status": RunStatus.queued,
            }
        click.echo(json.dumps({"project": project_id, **result}, default=str))
    if failed:
        sys.exit(1)


def _stack_database() -> None:
    """The configured database must exist: never create an empty one where the command
    happens to run (core/db.py ``require_existing``)."""
    from core.db import require_existing

    require_existing(get_settings().effective_database_url)


@click.group("adapters")
def adapters_group() -> None:
    """List, roll back and promote adapter versions."""


@adapters_group.command("list")
@click.option("--project", "-p", default=None, help="Only this project (default: every one).")
@click.option("--json", "as_json", is_flag=True)
def adapters_list(project: str | None, as_json: bool) -> None:
    """List adapter versions (every project, or one): number, status, name."""
    from trainer import serving_switch

    _stack_database()
    rows = serving_switch.list_versions(project)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        click.echo(f"{r['project']:<16} v{r['version']:<4} {r['status']:<10} {r['name']}")


def _serve(project: str, target: str | None, action: str) -> None:
    """Switch, print, return: the replaced version (``"unloading"``) is unloaded by the
    gateways' adapter sync once no request of theirs uses it (trainer/serving_switch.py).
    No ``target``: what served before the current version, as the admin API does."""
    from core.serving_version import previous_version
    from trainer import serving_switch
    from trainer.publish import PublishError, RefusedVersion

    _stack_database()
    if target is None:
        with serving_switch.db_factory()() as db:
            target = previous_version(db, project)
        if target is None:
            click.echo(
                f"rlgate: error: project {project!r} already serves the base model; "
                "nothing to roll back",
                err=True,
            )
            sys.exit(2)
    try:
        result = serving_switch.serve_version(
            project, target, actor="cli", action=action, unload=False
        )
    except (LookupError, PublishError, RefusedVersion) as e:
        click.echo(f"rlgate: error: {e}", err=True)
        sys.exit(2)
    click.echo(json.dumps(result))


@adapters_group.command("rollback")
@click.option("--project", "-p", default="default", show_default=True)
@click.argument("target", required=False)
def adapters_rollback(project: str, target: str | None) -> None:
    """Serve an earlier version again (TARGET: name, version number, or `base` for the
    base model; default: what served before the current version). Answers once new
    requests go to it; the replaced version is unloaded from the engines in the
    background when its requests are done."""
    _serve(project, target, "adapter.rollback")


@adapters_group.command("promote")
@click.option("--project", "-p", default="default", show_default=True)
@click.argument("target")
def adapters_promote(project: str, target: str) -> None:
    """Serve a given version (TARGET: name, version number, or `base` for the base
    model). Answers once new requests go to it, as rollback does."""
    _serve(project, target, "adapter.promote")
