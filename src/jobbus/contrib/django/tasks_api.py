"""Django's tasks framework, wherever it comes from: ``django.tasks`` (Django 6) or the ``django-tasks``
backport (Django 5.2). The same classes and signals under both names."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

#: Where the framework lives in this environment.
FRAMEWORK = "django.tasks" if importlib.util.find_spec("django.tasks") is not None else "django_tasks"
if importlib.util.find_spec(FRAMEWORK) is None:
    raise ImportError(
        "JobbusBackend needs Django's tasks framework: Django 6, or on Django 5.2 its backport "
        "(pip install django-tasks, and add 'django_tasks' to INSTALLED_APPS)"
    )

_base = importlib.import_module(f"{FRAMEWORK}.base")
_backends = importlib.import_module(f"{FRAMEWORK}.backends.base")
_exceptions = importlib.import_module(f"{FRAMEWORK}.exceptions")
_signals = importlib.import_module(f"{FRAMEWORK}.signals")

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_finished: Any = _signals.task_finished
task_started: Any = _signals.task_started
