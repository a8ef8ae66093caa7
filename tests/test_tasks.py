"""Typed tasks: arguments checked against the signature at defer time, encoded by annotation, decoded for
the function; options, transactional defer, `current_job()`; and `drain`, which runs them in-process."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pydantic
import pytest

import jobbus
from jobbus import JobStatus
from tests.mypy_run import mypy_output


@dataclass(frozen=True)
class Address:
    street: str
    city: str


@dataclass(frozen=True)
class Order:
    order_id: int
    total: Decimal
    placed_at: datetime
    ship_to: Address


class Customer(pydantic.BaseModel):
    email: str
    vip: bool = False


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


class Recorder:
    """Tasks bound to one test's App, recording what they received."""

    def __init__(self, app: jobbus.App) -> None:
        self.calls: list[tuple[str, Any]] = []

        @app.task("shop.confirm", queue="mail", max_attempts=4, priority=2)
        async def confirm(order: Order, customer: Customer, *, note: str = "thanks") -> dict[str, Any]:
            job = jobbus.current_job()
            self.calls.append(("confirm", (order, customer, note, job.id, job.attempt)))
            return {"order": order.order_id, "to": customer.email, "note": note}

        @app.task
        def invoice(order_id: int, lines: list[Address], /, *extra: int, **tags: str) -> Address:
            job = jobbus.current_sync_job()
            self.calls.append(("invoice", (order_id, lines, extra, tags, job.type)))
            return lines[0]

        @app.task(queue="flaky")
        async def flaky(times: int) -> None:
            job = jobbus.current_job()
            if job.attempt <= times:
                raise RuntimeError(f"attempt {job.attempt} fails")

        self.confirm = confirm
        self.invoice = invoice
        self.flaky = flaky


ORDER = Order(42, Decimal("12.50"), datetime(2026, 3, 1, 9, 30, tzinfo=UTC), Address("1 Main St", "Lyon"))


@pytest.mark.smoke
async def test_deferred_task_runs_with_its_typed_arguments_and_returns_its_result(app: jobbus.App) -> None:
    tasks = Recorder(app)
    job_id = await tasks.confirm.defer(ORDER, Customer(email="a@example.com"), note="merci")

    job = await app.find(job_id)
    assert job is not None
    assert (job.type, job.queue, job.max_attempts, job.priority) == ("shop.confirm", "mail", 4, 2)
    assert job.configuration_data == {
        "order": {
            "order_id": 42,
            "total": "12.50",
            "placed_at": "2026-03-01T09:30:00Z",
            "ship_to": {"street": "1 Main St", "city": "Lyon"},
        },
        "customer": {"email": "a@example.com", "vip": False},
        "note": "merci",
    }

    assert await app.drain() == {"completed": 1}
    [(name, (order, customer, note, seen_id, attempt))] = tasks.calls
    assert (name, order, customer, note, seen_id, attempt) == (
        "confirm",
        ORDER,
        Customer(email="a@example.com"),
        "merci",
        job_id,
        1,
    )
    done = await app.find(job_id)
    assert done is not None
    assert (done.status, done.result) == (JobStatus.COMPLETED, {"order": 42, "to": "a@example.com", "note": "merci"})


async def test_parameters_left_out_are_not_stored_and_take_the_functions_default(app: jobbus.App) -> None:
    tasks = Recorder(app)
    job_id = await tasks.confirm.defer(ORDER, customer=Customer(email="b@example.com", vip=True))
    job = await app.find(job_id)
    assert job is not None
    assert set(job.configuration_data) == {"order", "customer"}
    await app.drain()
    assert tasks.calls[0][1][2] == "thanks"


async def test_sync_task_gets_positional_only_star_args_and_kwargs_back(app: jobbus.App) -> None:
    tasks = Recorder(app)
    lines = [Address("1 Main St", "Lyon"), Address("2 Side St", "Nice")]
    job_id = await tasks.invoice.defer(7, lines, 1, 2, 3, region="south", channel="web")
    assert await app.drain() == {"completed": 1}
    expected_type = "tests.test_tasks.Recorder.__init__.<locals>.invoice"
    assert tasks.calls == [("invoice", (7, lines, (1, 2, 3), {"region": "south", "channel": "web"}, expected_type))]
    job = await app.find(job_id)
    assert job is not None
    assert (job.type, job.result) == (expected_type, {"street": "1 Main St", "city": "Lyon"})


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "task shop.confirm: missing a required argument: 'order'"),
        ((ORDER,), {"customer": Customer(email="c@example.com"), "cc": "x"}, "unexpected keyword argument 'cc'"),
        ((ORDER, Customer(email="c@example.com"), "merci"), {}, "too many positional arguments"),
        (("42", Customer(email="c@example.com")), {}, "argument 'order': Expected `object`, got `str`"),
        ((ORDER, {"email": "c@example.com"}), {}, "argument 'customer'"),
    ],
)
async def test_wrong_arguments_raise_type_error_and_write_nothing(
    app: jobbus.App, dsn: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    tasks = Recorder(app)
    with pytest.raises(TypeError) as raised:
        await tasks.confirm.defer(*args, **kwargs)
    assert message in str(raised.value)
    with pytest.raises(TypeError):
        tasks.confirm.defer_sync(*args, **kwargs)
    assert _count(dsn) == 0


async def test_values_that_would_not_survive_json_are_refused(app: jobbus.App, dsn: str) -> None:
    tasks = Recorder(app)
    with pytest.raises(TypeError, match=r"argument 'lines' does not survive JSON unchanged"):
        await tasks.invoice.defer(1, (Address("a", "b"),))  # type: ignore[arg-type]  # a tuple comes back a list
    with pytest.raises(TypeError, match=r"argument 'times': Expected `int`, got `bool`"):
        await tasks.flaky.defer(True)
    assert _count(dsn) == 0


async def test_options_set_per_job_fields_and_chain(app: jobbus.App) -> None:
    tasks = Recorder(app)
    group = uuid.uuid4()
    base = tasks.confirm.options(queue="urgent", priority=9, group_id=group)
    first = await base.options(unique_key="order:42", available_at=timedelta(minutes=5)).defer(
        ORDER, Customer(email="e@example.com")
    )
    again = await base.options(unique_key="order:42").defer(ORDER, Customer(email="e@example.com"))
    assert again == first
    job = await app.find(first)
    assert job is not None
    assert (job.queue, job.priority, job.group_id, job.unique_key) == ("urgent", 9, group, "order:42")
    assert job.available_at - job.created_at > timedelta(minutes=4)
    assert await app.drain() == {}  # not available for five minutes


async def test_defer_in_the_callers_transaction_commits_or_rolls_back_with_it(app: jobbus.App, dsn: str) -> None:
    tasks = Recorder(app)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(ZeroDivisionError):
            async with conn.transaction():
                await tasks.confirm.options(connection=conn).defer(ORDER, Customer(email="f@example.com"))
                raise ZeroDivisionError
        async with conn.transaction():
            kept = await tasks.confirm.options(connection=conn).defer(ORDER, Customer(email="g@example.com"))
    with psycopg.connect(dsn) as sync_conn, pytest.raises(ZeroDivisionError), sync_conn.transaction():
        tasks.invoice.options(connection=sync_conn).defer_sync(1, [])
        raise ZeroDivisionError
    with psycopg.connect(dsn) as sync_conn, pytest.raises(TypeError, match="use defer_sync"):
        await tasks.invoice.options(connection=sync_conn).defer(1, [])
    assert [job.id for job in await app.list_jobs()] == [kept]


def test_defer_sync_from_blocking_code(sync_app: jobbus.App) -> None:
    tasks = Recorder(sync_app)
    job_id = tasks.invoice.defer_sync(3, [Address("x", "y")])
    assert sync_app.sync.drain() == {"completed": 1}
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert job.status is JobStatus.COMPLETED


async def test_a_task_is_still_a_plain_function(app: jobbus.App) -> None:
    @app.task(name="add")
    def add(a: int, b: int = 1) -> int:
        return a + b

    assert add(2, b=3) == 5
    with pytest.raises(TypeError, match="must be a string"):
        app.task(42)  # type: ignore[call-overload]
    assert add.__name__ == "add"  # type: ignore[attr-defined]
    assert repr(add) == "<jobbus.Task add>"


async def test_current_job_outside_a_job_says_so() -> None:
    with pytest.raises(RuntimeError, match="outside a job"):
        jobbus.current_job()
    with pytest.raises(RuntimeError, match="outside a job"):
        jobbus.current_sync_job()


async def test_current_job_in_a_plain_handler_too(app: jobbus.App) -> None:
    seen: list[uuid.UUID] = []

    @app.job("plain")
    async def plain(job: jobbus.JobExecution) -> None:
        seen.append(jobbus.current_job().id)
        with pytest.raises(RuntimeError, match=r"use jobbus\.current_job"):
            jobbus.current_sync_job()

    job_id = await app.schedule("plain")
    assert await app.drain() == {"completed": 1}
    assert seen == [job_id]


async def test_arguments_the_function_no_longer_takes_fail_the_job_at_once(app: jobbus.App) -> None:
    tasks = Recorder(app)
    job_id = await app.schedule("shop.confirm", {"order": {}, "coupon": "X"})
    bad_value = await app.schedule("shop.confirm", {"order": {"order_id": "not a number"}})
    assert await app.drain() == {"failed": 2}
    gone, wrong = await app.find(job_id), await app.find(bad_value)
    assert gone is not None and wrong is not None
    assert gone.last_error is not None and "no longer takes: coupon" in gone.last_error
    assert wrong.last_error is not None and "argument 'order'" in wrong.last_error
    assert (gone.attempts, wrong.attempts) == (1, 1)
    assert tasks.calls == []


async def test_drain_counts_outcomes_and_honours_filters_and_limits(app: jobbus.App) -> None:
    tasks = Recorder(app)
    await tasks.flaky.defer(1)  # fails once, then succeeds (FAST settings retry at once)
    await tasks.flaky.defer(10)  # fails all three attempts
    for n in range(3):
        await tasks.confirm.defer(ORDER, Customer(email=f"{n}@example.com"))

    assert await app.drain(queues=["mail"], max_jobs=2) == {"completed": 2}
    assert await app.drain(types=["shop.confirm"]) == {"completed": 1}
    assert await app.drain() == {"retried": 3, "completed": 1, "failed": 1}
    assert await app.drain() == {}


def test_sync_drain_refuses_an_app_open_in_an_event_loop(dsn: str) -> None:
    import asyncio

    application = jobbus.App(dsn=dsn)

    @application.task
    def noop() -> None:
        pass

    async def main() -> None:
        async with application:
            with pytest.raises(RuntimeError, match=r"use await app\.drain"):
                application.sync.drain()

    asyncio.run(main())


def test_mypy_rejects_a_wrongly_typed_defer() -> None:
    out = mypy_output("wrong_defer.py")
    wrong_type = 'Argument 1 to "defer" of "Task" has incompatible type "str"; expected "int"'
    assert f"wrong_defer.py:21: error: {wrong_type}" in out
    assert 'wrong_defer.py:22: error: Unexpected keyword argument "urgent" for "defer_sync" of "Task"' in out
    assert 'wrong_defer.py:23: error: Missing positional argument "order_id" in call to "defer" of "TaskOptions"' in out
    assert "Found 3 errors in 1 file" in out, out


async def test_task_arguments_and_bus_messages_share_one_encoding(app: jobbus.App) -> None:
    tasks = Recorder(app)
    configuration = tasks.confirm.configuration(ORDER, Customer(email="h@example.com"))
    codec = jobbus.JsonCodec()
    assert configuration["order"] == codec.encode(ORDER)
    assert configuration["customer"] == codec.encode(Customer(email="h@example.com"))
    assert codec.decode(Order, configuration["order"]) == ORDER
