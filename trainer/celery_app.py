"""The Celery application every rlgate worker runs: the app of trainer/celery_base.py with
every task module registered on it (``celery -A trainer.celery_app worker``).

Importing this module is what makes a process know all the tasks by name (the worker,
beat); a producer sends by name and needs only trainer/celery_base.py. The task modules
never import this one (tests/test_imports.py: no import cycles).
"""

from __future__ import annotations

from trainer import retention, tasks  # noqa: F401 - registers the trainer's tasks
from trainer.celery_base import app

retention.register(app)  # daily payload retention job (trainer/retention.py)

__all__ = ["app"]
