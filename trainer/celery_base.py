"""The Celery application object, bare: the task modules (trainer/tasks.py, the retention
job) register on :data:`app`; trainer/celery_app.py imports them all onto it. Producers
send with :func:`publisher`.

Broker from settings: Redis or RabbitMQ in production; the embedded default is kombu's
SQLAlchemy transport on a SQLite file under the data dir (no broker server). The same
task code runs on every broker.
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from core.settings import Settings, get_settings


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    broker = settings.effective_broker_url
    if broker.startswith("sqla+sqlite:///"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = Celery("rlgate", broker=broker)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,  # a task whose worker dies is delivered again
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        # the verify pool's hard limit (prefork kills the process; the soft one lets the
        # task stop its command and give its slot back first)
        task_annotations={
            name: {
                "soft_time_limit": settings.verify_time_limit_s,
                "time_limit": settings.verify_time_limit_s + 15,
            }
            for name in ("rlgate.verifiers.verify_session", "rlgate.verifiers.next_turn")
        },
    )
    return app


app = make_celery()


@lru_cache(maxsize=4)
def _app_for(broker_url: str) -> Celery:
    return make_celery()


def publisher() -> Celery:
    """The app to send tasks with: :data:`app`, unless the settings name another broker
    than they did at import (tests, embedding processes). Every producer goes through it."""
    url = get_settings().effective_broker_url
    return app if app.conf.broker_url == url else _app_for(url)
