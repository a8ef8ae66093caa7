"""Celery's verbs on tasks: `delay` (blocking, as `defer_sync`) and `apply_async` (args, kwargs,
countdown or eta, expires, queue, priority), each returning the job id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus
from tests.mypy_run import mypy_output


def _tasks(app: jobbus.App) -> Any:
    @app.task("mail.send")
    def send(to: str, *, subject: str = "hello") -> str:
        return f"{to}: {subject}"

    return send


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


def test_delay_enqueues_and_the_job_runs(sync_app: jobbus.App) -> None:
    send = _tasks(sync_app)
    job_id = send.delay("ada@example.com", subject="hi")
    assert sync_app.sync.drain() == {"completed": 1}
    job = sync_app.sync.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED
    assert job.result == "ada@example.com: hi"


def test_apply_async_sets_every_option(sync_app: jobbus.App) -> None:
    send = _tasks(sync_app)
    later = send.apply_async(["a@example.com"], {"subject": "s"}, countdown=600, queue="mail", priority=4, expires=3600)
    eta = datetime(2031, 1, 1, tzinfo=UTC)
    at = send.apply_async(args=("b@example.com",), eta=eta, expires=datetime(2031, 1, 2, tzinfo=UTC))
    now = send.apply_async(("c@example.com",), countdown=0)
    jobs = {job_id: sync_app.sync.find(job_id) for job_id in (later, at, now)}
    first, second, third = (jobs[later], jobs[at], jobs[now])
    assert first is not None and second is not None and third is not None
    assert first.configuration_data == {"to": "a@example.com", "subject": "s"}
    assert (first.queue, first.priority) == ("mail", 4)
    assert timedelta(minutes=9) < first.available_at - first.created_at <= timedelta(minutes=10, seconds=1)
    assert first.expires_at is not None
    assert timedelta(minutes=59) < first.expires_at - first.created_at <= timedelta(minutes=61)
    assert second.available_at == eta and second.expires_at == datetime(2031, 1, 2, tzinfo=UTC)
    assert third.available_at - third.created_at < timedelta(seconds=5) and third.expires_at is None
    assert sync_app.sync.drain() == {"completed": 1}  # only the one due now


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        ({"args": ("x",), "countdown": 5, "eta": datetime(2031, 1, 1, tzinfo=UTC)}, jobbus.InvalidJobError, "not both"),
        ({"args": ("x",), "countdown": -1}, jobbus.InvalidJobError, "countdown must be 0"),
        ({"args": ("x",), "eta": datetime(2031, 1, 1)}, jobbus.InvalidJobError, "eta must be an aware datetime"),
        ({"args": ("x",), "expires": -5}, jobbus.InvalidJobError, "expires must be more than 0"),
        ({"args": "x"}, TypeError, "args must be a list or tuple"),
        ({"args": ("x",), "kwargs": ["subject"]}, TypeError, "kwargs must be a dict"),
        ({"args": (), "kwargs": {"subject": "s"}}, TypeError, "missing a required argument"),
        ({"args": ("x",), "kwargs": {"urgent": True}}, TypeError, "unexpected keyword argument"),
        ({"args": (42,)}, TypeError, "argument 'to'"),
    ],
)
def test_apply_async_refuses_bad_input_and_writes_nothing(
    dsn: str, sync_app: jobbus.App, call: dict[str, Any], error: type[Exception], match: str
) -> None:
    send = _tasks(sync_app)
    with pytest.raises(error, match=match):
        send.apply_async(**call)
    assert _count(dsn) == 0


def test_mypy_checks_delay_arguments_and_apply_async_options() -> None:
    out = mypy_output("wrong_delay.py")
    assert (
        'wrong_delay.py:22: error: Argument 1 to "delay" of "Task" has incompatible type "str"; expected "int"' in out
    )
    assert 'wrong_delay.py:23: error: Unexpected keyword argument "urgent" for "delay" of "Task"' in out
    assert 'wrong_delay.py:24: error: Argument "countdown" to "apply_async" of "Task" has incompatible type' in out
    assert "Found 3 errors in 1 file" in out, out
