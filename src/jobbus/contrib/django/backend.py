"""`JobbusBackend`: Django's tasks framework on jobbus.

Each enqueued Django task is one jobbus job of type ``django.task``: its configuration holds the
task's module path and its JSON arguments, its queue and priority are the task's, `run_after` is its
`available_at`, and its job id is the result id. The job is written on Django's own connection, so
inside ``transaction.atomic()`` it commits or rolls back with the rest. Workers (``manage.py jobbus
worker``) import the task by its module path and call it; the return value is the job's result, and
an exception's class and traceback are kept in the job's `execution_data` for `TaskResult.errors`.

A Django task raising an exception is FAILED, as with Django's own backends, unless the backend's
``OPTIONS`` say ``"max_attempts": n``: then jobbus retries it with backoff, and its status is READY
between attempts.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.utils import timezone

from jobbus.app import App
from jobbus.contrib.django import tasks_api as api
from jobbus.contrib.django.conf import connection, database_alias, get_app, joins_django_transactions
from jobbus.contrib.django.handler import DJANGO_TASK_TYPE, ERRORS_KEY, django_task, json_value
from jobbus.models import Job, JobStatus

_STATUS = {
    JobStatus.QUEUED: api.TaskResultStatus.READY,
    JobStatus.RUNNING: api.TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: api.TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: api.TaskResultStatus.FAILED,
    JobStatus.CANCELLED: api.TaskResultStatus.FAILED,
}


class JobbusBackend(api.BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "jobbus.contrib.django.JobbusBackend", "QUEUES": [...],
    "OPTIONS": {"max_attempts": 1}}}``. An empty ``QUEUES`` list accepts any queue name."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.max_attempts = int(self.options.get("max_attempts", 1))

    @property
    def app(self) -> App:
        return get_app()

    def check(self, **kwargs: Any) -> list[Any]:
        """Django's system checks: the app is installed (its migration creates the schema) and the
        database is PostgreSQL."""
        from django.apps import apps
        from django.core import checks
        from django.db import connections

        found: list[Any] = []
        if not apps.is_installed("jobbus.contrib.django"):
            found.append(
                checks.Error(
                    f"the task backend {self.alias!r} is jobbus, but jobbus.contrib.django is not installed",
                    hint='add "jobbus.contrib.django" to INSTALLED_APPS (its migration creates jobbus\'s schema)',
                    id="jobbus.E001",
                )
            )
        alias = database_alias()
        if alias not in connections.settings or connections[alias].vendor != "postgresql":
            found.append(
                checks.Error(
                    f"jobbus needs PostgreSQL: JOBBUS['database'] = {alias!r} is not a PostgreSQL database",
                    hint="point JOBBUS['database'] at a database whose ENGINE is django.db.backends.postgresql",
                    id="jobbus.E002",
                )
            )
        return found

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        configuration = {
            "task": task.module_path,
            "args": json_value(list(args), "args"),
            "kwargs": json_value(dict(kwargs), "kwargs"),
            "backend": self.alias,
        }
        job_id = self.app.sync.schedule(
            DJANGO_TASK_TYPE,
            configuration,
            name=task.module_path,
            queue=task.queue_name,
            priority=task.priority,
            available_at=task.run_after,
            max_attempts=self.max_attempts,
            connection=connection() if joins_django_transactions() else None,
        )
        result = api.TaskResult(
            task=task,
            id=str(job_id),
            status=api.TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=configuration["args"],
            kwargs=configuration["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        api.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's result as committed: read on jobbus's own pool, like a worker would see it."""
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise api.TaskResultDoesNotExist(result_id) from None
        job = self.app.sync.find(job_id)
        if job is None or job.type != DJANGO_TASK_TYPE:
            raise api.TaskResultDoesNotExist(result_id)
        return result_of(job, self.alias)


def result_of(job: Job, alias: str) -> Any:
    """The `TaskResult` of a Django task's job, as it stands."""
    configuration = job.configuration_data
    task = django_task(configuration, job)
    attempted = [entry.get("worker_id") or "" for entry in job.history if "attempt" in entry]
    if job.status is JobStatus.RUNNING and job.worker_id:
        attempted.append(job.worker_id)
    errors = [
        api.TaskError(exception_class_path=error["exception_class_path"], traceback=error["traceback"])
        for error in job.execution_data.get(ERRORS_KEY, [])
    ]
    finished = job.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
    result = api.TaskResult(
        task=task,
        id=str(job.id),
        status=_STATUS[job.status],
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at if finished else None,
        last_attempted_at=_last_attempt(job),
        args=configuration.get("args", []),
        kwargs=configuration.get("kwargs", {}),
        backend=alias,
        errors=errors,
        worker_ids=attempted,
    )
    object.__setattr__(result, "_return_value", job.result)
    return result


def _last_attempt(job: Job) -> datetime | None:
    if job.status is JobStatus.RUNNING or not job.history:
        return job.started_at
    return job.finished_at or job.started_at
