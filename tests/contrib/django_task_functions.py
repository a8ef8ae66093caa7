"""Django tasks for tests/contrib/test_django.py: module-level, as Django's tasks framework requires."""

from __future__ import annotations

from typing import Any

from jobbus.contrib.django.tasks_api import FRAMEWORK

if FRAMEWORK == "django.tasks":
    from django.tasks import task
else:
    from django_tasks import task

#: What the tasks ran, in order (they run in this process's worker threads under `drain`).
EXECUTED: list[Any] = []


@task()
def noop(*args: Any, **kwargs: Any) -> None:
    EXECUTED.append(("noop", args, kwargs))


@task(priority=10)
def calculate(a: int, b: int) -> int:
    EXECUTED.append(("calculate", a, b))
    return a * b


@task(queue_name="mail")
def mail(to: str) -> dict[str, str]:
    EXECUTED.append(("mail", to))
    return {"sent_to": to}


@task()
def failing(message: str) -> None:
    EXECUTED.append(("failing", message))
    raise ValueError(message)


@task(takes_context=True)
def with_context(context: Any, label: str) -> dict[str, Any]:
    EXECUTED.append(("with_context", label))
    return {"attempt": context.attempt, "id": context.task_result.id, "label": label}


@task()
async def async_task(value: int) -> int:
    EXECUTED.append(("async_task", value))
    return value + 1
