"""The worker's side of `JobbusBackend`: the handler of ``django.task`` jobs. It imports the Django task a
job names by its module path and runs it, with the results, errors and signals Django's tasks framework
has; the backend reads them back from the job."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from jobbus.app import App
from jobbus.contrib.django import tasks_api as api
from jobbus.execution import SyncJobExecution
from jobbus.models import Job
from jobbus.worker.outcomes import traceback_text

#: The job type of every Django task.
DJANGO_TASK_TYPE = "django.task"
#: Where a failed attempt's exception is kept in `execution_data` (its traceback masked and bounded).
ERRORS_KEY = "django_task_errors"
#: This process, as `TaskResult.worker_ids` shows it while a task runs here.
WORKER_ID = f"{socket.gethostname()}-{os.getpid()}"


def register_handler(app: App) -> None:
    """Register the handler of ``django.task`` jobs on `app` (once)."""
    if DJANGO_TASK_TYPE not in app.handlers:
        app.job(DJANGO_TASK_TYPE)(run_django_task)


def run_django_task(job: SyncJobExecution) -> Any:
    """Run one Django task in a worker thread, with Django's per-request connection hygiene around it."""
    configuration = job.configuration
    close_old_connections()
    try:
        task = django_task(configuration, None, queue=job.queue)
        result = _running(job, task, configuration)
        sender = type(task.get_backend())  # the backend's class, as Django's own backends send
        api.task_started.send(sender=sender, task_result=result)
        args, kwargs = list(configuration.get("args", [])), dict(configuration.get("kwargs", {}))
        try:
            if task.takes_context:
                value = task.call(api.TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = json_value(value, "the return value")
        except BaseException as exc:
            # Stored in the checkpoint: bounded and masked as the job's history keeps it.
            error = {"exception_class_path": _path(type(exc)), "traceback": traceback_text(exc)}
            errors = [*job.execution_data.get(ERRORS_KEY, []), error]
            job.checkpoint({**job.execution_data, ERRORS_KEY: errors})
            object.__setattr__(result, "status", api.TaskResultStatus.FAILED)
            object.__setattr__(result, "finished_at", timezone.now())
            result.errors.append(api.TaskError(**error))
            api.task_finished.send(sender=sender, task_result=result)
            raise
        object.__setattr__(result, "status", api.TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "_return_value", value)
        api.task_finished.send(sender=sender, task_result=result)
        return value
    finally:
        close_old_connections()


def _running(job: SyncJobExecution, task: Any, configuration: Any) -> Any:
    now = timezone.now()
    return api.TaskResult(
        task=task,
        id=str(job.id),
        status=api.TaskResultStatus.RUNNING,
        enqueued_at=job.created_at,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(configuration.get("args", [])),
        kwargs=dict(configuration.get("kwargs", {})),
        backend=str(configuration.get("backend", "default")),
        errors=[
            api.TaskError(exception_class_path=error["exception_class_path"], traceback=error["traceback"])
            for error in job.execution_data.get(ERRORS_KEY, [])
        ],
        worker_ids=[*([""] * (job.attempt - 1)), WORKER_ID],  # one per attempt: `attempts` counts them
    )


def django_task(configuration: Any, job: Job | None, *, queue: str | None = None) -> Any:
    """The Django Task named by a job, with the job's queue and priority."""
    path = configuration.get("task")
    try:
        task = import_string(path)
    except ImportError:
        raise api.TaskResultDoesNotExist(f"the task {path!r} of this job cannot be imported") from None
    if not isinstance(task, api.Task):
        raise api.TaskResultDoesNotExist(f"{path!r} is not a Django task")
    changes: dict[str, Any] = {"backend": configuration.get("backend", task.backend)}
    if job is not None:
        changes.update(queue_name=job.queue, priority=job.priority)
    elif queue is not None:
        changes.update(queue_name=queue)
    return task.using(**changes)


def json_value(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a Django task's {what} must be JSON: {exc}") from None


def _path(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
