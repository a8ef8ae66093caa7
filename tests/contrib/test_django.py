"""`jobbus.contrib.django` against a real Django project (examples/django_shop) on a fresh database per test.

The backend tests follow the shape of Django's own task backend tests: capabilities, enqueue (sync and
async), invalid tasks, priorities, `run_after`, queue names, results (success, failure with its
exception, context, async functions, mismatched tasks, unknown ids) and signals; then what only a
database backend has: enqueue joining Django's transaction, the schema as a Django migration,
``manage.py jobbus`` in real processes, and the example's view. They run on Django 5.2 with the
``django-tasks`` backport here and on Django 6 in ``make test-django6``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import django
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_shop"
sys.path.insert(0, str(PROJECT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront_site.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobbus.contrib.django import JobbusBackend, get_app  # noqa: E402
from jobbus.contrib.django import tasks_api as api  # noqa: E402
from jobbus.contrib.django.handler import DJANGO_TASK_TYPE  # noqa: E402
from jobbus.contrib.django.management.commands import jobbus as jobbus_command  # noqa: E402
from jobbus.encryption import generate_key  # noqa: E402
from jobbus.redaction import MASK  # noqa: E402
from jobbus.settings import Settings  # noqa: E402
from tests.contrib import django_task_functions as fns  # noqa: E402

if api.FRAMEWORK == "django.tasks":
    from django.tasks import default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultMismatch
else:
    from django_tasks import default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError, TaskResultMismatch

Status = api.TaskResultStatus


@pytest.fixture
def django_db(empty_dsn: str) -> Iterator[str]:
    """Django's default database pointed at a fresh, empty database, then ``manage.py migrate``."""
    params = conninfo_to_dict(empty_dsn)
    connections["default"].close()
    connections.settings["default"].update(
        NAME=params["dbname"],
        USER=params.get("user", ""),
        PASSWORD=params.get("password", ""),
        HOST=params.get("host", ""),
        PORT=params.get("port", ""),
    )
    call_command("migrate", verbosity=0)
    fns.EXECUTED.clear()
    try:
        yield empty_dsn
    finally:
        connections.close_all()
        get_app().sync.close()


def _jobs(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT name, queue, priority, status FROM jobbus.job ORDER BY created_at, id").fetchall()


def _drain() -> dict[str, int]:
    return get_app().sync.drain()


# -- the backend, as Django's own backend tests check one ------------------------------------------


def test_the_configured_backend_is_jobbus_with_every_capability(django_db: str) -> None:
    uses_djangos_own = api.FRAMEWORK == "django.tasks"
    assert uses_djangos_own is (django.VERSION >= (6,))
    backend = task_backends["default"]
    assert isinstance(backend, JobbusBackend)
    assert default_task_backend.alias == "default"
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result) == (True, True, True)
    assert backend.supports_priority
    assert backend.queues == {"default", "mail"}


def test_system_checks_pass_and_name_a_missing_app_or_database(django_db: str) -> None:
    from django.core import checks

    assert [message for message in checks.run_checks() if message.id.startswith("jobbus.")] == []
    with override_settings(INSTALLED_APPS=["storefront"], JOBBUS={"database": "elsewhere"}):
        found = {message.id for message in task_backends["default"].check()}
    assert found == {"jobbus.E001", "jobbus.E002"}


@pytest.mark.smoke
def test_enqueue_returns_a_ready_result_and_writes_one_job(django_db: str) -> None:
    result = fns.calculate.enqueue(6, b=7)
    assert result.status == Status.READY
    assert not result.is_finished
    assert (result.args, result.kwargs, result.backend) == ([6], {"b": 7}, "default")
    assert result.enqueued_at is not None and result.started_at is None and result.finished_at is None
    assert result.attempts == 0 and result.errors == []
    uuid.UUID(result.id)
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    assert _jobs(django_db) == [("tests.contrib.django_task_functions.calculate", "default", 10, "queued")]
    assert fns.EXECUTED == []  # nothing runs until a worker does


async def test_aenqueue_and_aget_result(django_db: str) -> None:
    result = await fns.mail.aenqueue("a@example.com")
    assert result.status == Status.READY
    fetched = await fns.mail.aget_result(result.id)
    assert (fetched.id, fetched.status, fetched.args) == (result.id, Status.READY, ["a@example.com"])


def test_a_worker_runs_the_task_and_the_result_shows_it(django_db: str) -> None:
    result = fns.calculate.enqueue(6, 7)
    assert _drain() == {"completed": 1}
    assert fns.EXECUTED == [("calculate", 6, 7)]

    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == Status.SUCCESSFUL and fetched.is_finished
    assert fetched.return_value == 42
    assert fetched.attempts == 1 and len(fetched.worker_ids) == 1
    assert fetched.enqueued_at <= fetched.started_at <= fetched.finished_at
    assert fetched.last_attempted_at is not None
    assert fetched.task.func is fns.calculate.func
    assert fns.calculate.get_result(result.id).return_value == 42

    result.refresh()
    assert (result.status, result.return_value) == (Status.SUCCESSFUL, 42)


def test_a_failing_task_is_failed_with_its_exception(django_db: str) -> None:
    result = fns.failing.enqueue("it broke")
    assert _drain() == {"failed": 1}
    result.refresh()
    assert result.status == Status.FAILED
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "ValueError: it broke" in error.traceback
    assert "raise ValueError(message)" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_a_failing_tasks_traceback_is_kept_masked_and_bounded(django_db: str) -> None:
    result = fns.failing.enqueue("refused: api_key=" + "k" * 200 + " " + "x" * 100_000 + " token=" + "t" * 200)
    assert _drain() == {"failed": 1}
    result.refresh()
    [error] = result.errors
    assert len(error.traceback.encode()) <= 16 * 1024 and error.traceback.startswith("... (cut to its last")
    assert error.traceback.rstrip().endswith(f"token={MASK}") and "t" * 200 not in error.traceback


def test_with_max_attempts_in_options_a_failing_task_is_retried_and_ready_between_attempts(django_db: str) -> None:
    tasks = {
        "default": {"BACKEND": "jobbus.contrib.django.JobbusBackend", "QUEUES": ["default", "mail"]},
        "retrying": {"BACKEND": "jobbus.contrib.django.JobbusBackend", "QUEUES": [], "OPTIONS": {"max_attempts": 3}},
    }
    with override_settings(TASKS=tasks):
        result = fns.failing.using(backend="retrying", queue_name="anything").enqueue("once")
        assert _drain() == {"retried": 1}  # the next attempt waits out the backoff
        result.refresh()
        assert (result.status, result.attempts, result.backend) == (Status.READY, 1, "retrying")
        assert [error.exception_class for error in result.errors] == [ValueError]
        with psycopg.connect(django_db) as conn:
            assert conn.execute("SELECT max_attempts, queue FROM jobbus.job").fetchone() == (3, "anything")


def test_a_task_taking_context_sees_its_result_and_attempt(django_db: str) -> None:
    result = fns.with_context.enqueue(label="x")
    _drain()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "label": "x"}


def test_async_task_functions_run(django_db: str) -> None:
    result = fns.async_task.enqueue(41)
    _drain()
    result.refresh()
    assert result.return_value == 42


def test_higher_priority_runs_first_then_the_order_of_enqueue(django_db: str) -> None:
    fns.noop.enqueue("first")
    fns.noop.using(priority=-5).enqueue("low")
    fns.noop.using(priority=50).enqueue("high")
    fns.noop.enqueue("second")
    _drain()
    assert [args[0] for _, args, _ in fns.EXECUTED] == ["high", "first", "second", "low"]


def test_run_after_delays_the_job(django_db: str) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = fns.noop.using(run_after=later).enqueue()
    assert _drain() == {}
    assert default_task_backend.get_result(result.id).status == Status.READY
    with psycopg.connect(django_db) as conn:
        row = conn.execute("SELECT available_at FROM jobbus.job").fetchone()
    assert row is not None and row[0] == later


def test_queue_names_are_the_jobs_queues_and_unknown_ones_are_refused(django_db: str) -> None:
    fns.mail.enqueue("a@example.com")
    fns.noop.using(queue_name="mail").enqueue()
    assert [queue for _, queue, _, _ in _jobs(django_db)] == ["mail", "mail"]
    with pytest.raises(InvalidTaskError, match="Queue 'elsewhere' is not valid"):
        fns.noop.using(queue_name="elsewhere")
    assert get_app().sync.drain(queues=["default"]) == {}
    assert get_app().sync.drain(queues=["mail"]) == {"completed": 2}


def test_invalid_tasks_are_refused_when_defined(django_db: str) -> None:
    with pytest.raises(InvalidTaskError, match="priority"):
        fns.noop.using(priority=1000)
    with pytest.raises(InvalidTaskError, match="aware"):
        fns.noop.using(run_after=timezone.now().replace(tzinfo=None))
    with pytest.raises(TypeError, match="must be JSON"):
        fns.noop.enqueue(object())
    assert _jobs(django_db) == []


def test_unknown_and_mismatched_results(django_db: str) -> None:
    result = fns.calculate.enqueue(1, 2)
    with pytest.raises(api.TaskResultDoesNotExist):
        default_task_backend.get_result(str(uuid.uuid4()))
    with pytest.raises(api.TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-job-id")
    other = get_app().sync.schedule("shop.restock_alert", {"sku": "x", "left": 1})
    with pytest.raises(api.TaskResultDoesNotExist):
        default_task_backend.get_result(str(other))  # a job, but not a Django task's
    with pytest.raises(TaskResultMismatch):
        fns.noop.get_result(result.id)


def test_signals_are_sent_on_enqueue_start_and_finish(django_db: str) -> None:
    seen: list[tuple[str, Any, Any]] = []

    def record(name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result.status, sender))

        return receiver

    receivers = {
        signal: record(name)
        for name, signal in (
            ("enqueued", api.task_enqueued),
            ("started", api.task_started),
            ("finished", api.task_finished),
        )
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        fns.noop.enqueue()
        _drain()
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert seen == [
        ("enqueued", Status.READY, JobbusBackend),
        ("started", Status.RUNNING, JobbusBackend),
        ("finished", Status.SUCCESSFUL, JobbusBackend),
    ]


# -- Django's transaction ----------------------------------------------------------------------------


def test_enqueue_joins_djangos_transaction(django_db: str) -> None:
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        fns.noop.enqueue("rolled back")
        raise ZeroDivisionError
    with transaction.atomic():
        kept = fns.noop.enqueue("committed")
        with pytest.raises(ZeroDivisionError), transaction.atomic():  # a savepoint rolls back alone
            fns.noop.enqueue("savepoint")
            raise ZeroDivisionError
    assert [name for name, *_ in _jobs(django_db)] == ["tests.contrib.django_task_functions.noop"]
    _drain()
    assert fns.EXECUTED == [("noop", ("committed",), {})]
    assert default_task_backend.get_result(kept.id).status == Status.SUCCESSFUL


def _spelled(dsn: str, spelling: str) -> str:
    """The same database spelled another way."""
    params = conninfo_to_dict(dsn)
    user, host, dbname, port = params["user"], params["host"], params["dbname"], params.get("port") or "5432"
    loopback = "localhost" if host != "localhost" else "127.0.0.1"
    return {
        # a URI without the port, with a parameter added
        "uri": f"postgresql://{user}@{host}/{dbname}?connect_timeout=10",
        # key=value, the other loopback name, more parameters
        "key=value": f"host={loopback} port={port} dbname={dbname} user={user} application_name=jobs sslmode=disable",
        # the other scheme, a port with a leading zero
        "postgres://": f"postgres://{user}@{loopback}:0{port}/{dbname}?application_name=jobs",
    }[spelling]


@pytest.mark.server  # needs a TCP server (the embedded one listens on a socket only)
@pytest.mark.parametrize("spelling", ["uri", "key=value", "postgres://"])
def test_a_jobbus_dsn_naming_djangos_database_still_joins_its_transaction(django_db: str, spelling: str) -> None:
    from django.conf import settings

    with override_settings(JOBBUS={**settings.JOBBUS, "dsn": _spelled(django_db, spelling)}):
        get_app().sync.close()
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            fns.noop.enqueue("rolled back")
            raise ZeroDivisionError
        assert _jobs(django_db) == []
        with transaction.atomic():
            kept = fns.noop.enqueue("committed")
            assert _jobs(django_db) == []  # not visible before Django commits
        assert [name for name, *_ in _jobs(django_db)] == ["tests.contrib.django_task_functions.noop"]
        assert get_app().settings.dsn == _spelled(django_db, spelling)  # the App's own pool is the dsn given
        _drain()
        assert fns.EXECUTED == [("noop", ("committed",), {})]
        assert default_task_backend.get_result(kept.id).status == Status.SUCCESSFUL
        get_app().sync.close()


def test_a_jobbus_dsn_naming_another_database_enqueues_there_at_once(django_db: str, dsn: str) -> None:
    from django.conf import settings

    with override_settings(JOBBUS={**settings.JOBBUS, "dsn": dsn}):
        get_app().sync.close()
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            fns.noop.enqueue("committed on its own")
            raise ZeroDivisionError
        assert _jobs(django_db) == []
        assert [name for name, *_ in _jobs(dsn)] == ["tests.contrib.django_task_functions.noop"]
        get_app().sync.close()


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("host=127.0.0.1 port=5432 dbname=shop user=web", "postgresql://web@localhost/shop", True),
        ("host=::1 dbname=shop user=web", "postgresql://web@[::1]:5432/shop?sslmode=prefer", True),
        ("host=DB.Example.com dbname=shop user=web password=a", "postgresql://web:b@db.example.com./shop", True),
        ("host=127.0.0.2 dbname=shop user=web", "host=localhost dbname=shop user=web", True),
        ("host=db1 dbname=shop user=web", "host=db2 dbname=shop user=web", False),
        ("host=db dbname=shop user=web", "host=db port=5433 dbname=shop user=web", False),
        ("host=db port=05432 dbname=shop user=web", "postgresql://web@db:5432/shop", True),
        ("host=db dbname=shop user=web", "host=db dbname=shop_jobs user=web", False),
        ("host=db dbname=shop user=web", "host=db dbname=shop user=jobs", False),
        ("host=/var/run/postgresql dbname=shop user=web", "host=localhost dbname=shop user=web", False),
        ("service=shop", "host=db dbname=shop user=web", False),
    ],
)
def test_which_dsns_name_the_same_database(first: str, second: str, same: bool) -> None:
    from jobbus.contrib.django.conf import same_database

    assert same_database(first, second) is same
    assert same_database(second, first) is same


def test_a_copy_batch_in_djangos_transaction_rolls_back_with_it(django_db: str) -> None:
    from jobbus.contrib.django import connection

    app = get_app()
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        ids = app.sync.schedule_many(
            "shop.restock_alert", [{"sku": "x", "left": n} for n in range(1500)], connection=connection()
        )
        assert len(ids) == 1500
        raise ZeroDivisionError
    assert _jobs(django_db) == []
    with transaction.atomic():
        app.sync.schedule_many(
            "shop.restock_alert", [{"sku": "x", "left": n} for n in range(1500)], connection=connection()
        )
    assert len(_jobs(django_db)) == 1500


# -- the migration, the command, the example ------------------------------------------------------------


def test_the_django_migration_creates_and_drops_jobbus_schema(django_db: str) -> None:
    from jobbus import schema

    with psycopg.connect(django_db) as conn:
        row = conn.execute("SELECT max(version) FROM jobbus.migration").fetchone()
    assert row is not None and row[0] == schema.latest_version()
    call_command("migrate", "jobbus", "zero", verbosity=0)
    with psycopg.connect(django_db) as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'jobbus'").fetchone() is None
    call_command("migrate", "jobbus", verbosity=0)
    call_command("jobbus", "migrate")  # jobbus's own command agrees: nothing to apply


def _manage(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBBUS_")}
    env.update(DATABASE_URL=dsn, DJANGO_SETTINGS_MODULE="storefront_site.settings")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(PROJECT.parents[1])])
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120
    )


def test_manage_py_jobbus_runs_the_cli_and_a_worker_in_real_processes(empty_dsn: str) -> None:
    migrated = _manage(empty_dsn, "migrate", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO storefront_order (email, sku, receipt_sent) VALUES ('a@example.com', 'mug', false)")
    enqueue = "from storefront.tasks import send_receipt; print(send_receipt.enqueue(1).id)"
    shell = _manage(empty_dsn, "shell", "-c", enqueue)
    assert shell.returncode == 0, shell.stderr
    result_id = shell.stdout.strip().splitlines()[-1]

    status = _manage(empty_dsn, "jobbus", "jobs", "list", "--json")
    assert status.returncode == 0, status.stderr
    assert result_id in status.stdout

    worker = _manage(empty_dsn, "jobbus", "worker", "--stop-when-empty", "--queue", "mail")
    assert worker.returncode == 0, worker.stderr
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT receipt_sent FROM storefront_order").fetchall() == [(True,)]
        row = conn.execute("SELECT status, result FROM jobbus.job").fetchone()
    assert row == ("completed", "receipt for order 1 sent to a@example.com")

    bad = _manage(empty_dsn, "jobbus", "jobs", "show", "not-an-id")
    assert bad.returncode != 0 and "error" in bad.stderr.lower()


def test_the_projects_settings_reach_the_cli_as_the_variables_it_reads_back() -> None:
    """`manage.py jobbus` hands the project's App settings to the CLI as JOBBUS_* variables: every setting
    given reads back the same, cells and queue_cells (mappings) and encryption_keys (a list) included."""
    given = Settings.load(
        {
            "cells": {"eu": "postgresql://db-eu/shop", "us": "postgresql://db-us/shop?sslmode=require"},
            "queue_cells": {"reports": "us", "mail": "eu"},
            "encryption_keys": (generate_key(), generate_key()),
            "lease_seconds": 45.5,
            "transaction_pooling": True,
        },
        environ={},
    )
    project = SimpleNamespace(settings=given)
    with mock.patch.object(jobbus_command, "get_app", return_value=project), jobbus_command.project_environment():
        variables = {name: value for name, value in os.environ.items() if name.startswith("JOBBUS_")}
    assert variables["JOBBUS_CELLS"] == "eu=postgresql://db-eu/shop;us=postgresql://db-us/shop?sslmode=require"
    assert Settings.load({}, environ=variables).as_dict() == given.as_dict()


def test_the_projects_own_tests_run_under_djangos_test_runner(empty_dsn: str) -> None:
    run = _manage(empty_dsn, "test", "storefront", "-v", "2", "--noinput")
    assert run.returncode == 0, run.stderr
    assert "Applying jobbus.0001_schema... OK" in run.stdout + run.stderr
    assert "Ran 2 tests" in run.stderr and "OK" in run.stderr


def test_the_example_view_enqueues_in_its_transaction(django_db: str) -> None:
    from storefront.models import Order, Stock

    Stock.objects.create(sku="mug", quantity=2)
    client = Client()
    placed = client.post("/orders", {"email": "a@example.com", "sku": "mug"}, content_type="application/json")
    assert placed.status_code == 200, placed.content
    client.post("/orders", {"email": "b@example.com", "sku": "mug"}, content_type="application/json")
    refused = client.post("/orders", {"email": "c@example.com", "sku": "mug"}, content_type="application/json")
    assert refused.status_code == 409
    assert list(Order.objects.values_list("email", flat=True).order_by("id")) == ["a@example.com", "b@example.com"]
    with psycopg.connect(django_db) as conn:
        types = conn.execute("SELECT type, count(*) FROM jobbus.job GROUP BY type ORDER BY type").fetchall()
    assert types == [(DJANGO_TASK_TYPE, 2), ("shop.restock_alert", 2)]  # stock went 2 → 1 → 0, then refused
    assert _drain() == {"completed": 4}
    assert Order.objects.filter(receipt_sent=True).count() == 2
    receipt = default_task_backend.get_result(placed.json()["receipt_job"])
    assert receipt.return_value == f"receipt for order {placed.json()['order_id']} sent to a@example.com"
