"""The message bus against a real PostgreSQL: registration, dispatch, envelopes and the worker side."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import re
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import psycopg
import pydantic
import pytest

import jobbus
from jobbus.bus import (
    BUS_JOB_TYPE,
    CodecError,
    EnvelopeError,
    JsonCodec,
    MessageBus,
    current_correlation_id,
)
from tests.bus.apps import RECORD_TABLE, WIRE_NAME, AddressChanged, build
from tests.bus.helpers import OrderPlaced, bus_jobs, execute, order_bus, run_worker
from tests.lossy import Account, Login, Profile, Reading, Reference

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass(frozen=True)
class Ping:
    n: int


@dataclass(frozen=True)
class Opaque:
    thing: Any


class Invoice(TypedDict):
    number: str
    due: datetime


class Signup(pydantic.BaseModel):
    email: str
    at: datetime
    credit: Decimal


class PingTextCodec:
    """A custom codec: a Ping travels as the string "ping:<n>"."""

    name = "ping-text"

    def encode(self, obj: Any) -> Any:
        return f"ping:{obj.n}"

    def decode(self, cls: type[T], data: Any) -> T:
        factory: Callable[[int], T] = cls
        return factory(int(str(data).removeprefix("ping:")))


# -- helpers ----------------------------------------------------------------------------------------


async def run_worker_process(version: str, dsn: str) -> tuple[int | None, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.bus.apps",
        version,
        dsn,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    return process.returncode, stderr.decode()


# -- inline bindings --------------------------------------------------------------------------------


async def test_inline_bindings_run_inside_dispatch_in_registration_order(app: jobbus.App) -> None:
    bus = order_bus(app)
    seen: list[tuple[str, int]] = []

    @bus.handler(OrderPlaced)
    def first(message: OrderPlaced) -> None:
        seen.append(("first", message.order_id))

    @bus.handler(OrderPlaced)
    async def second(message: OrderPlaced) -> None:
        await asyncio.sleep(0)
        seen.append(("second", message.order_id))

    @bus.handler(OrderPlaced)
    def third(message: OrderPlaced) -> None:
        seen.append(("third", message.order_id))

    result = await bus.dispatch(OrderPlaced(7, Decimal("9.99")))

    assert seen == [("first", 7), ("second", 7), ("third", 7)]
    assert (result.job_ids, result.jobs_by_binding) == ([], {})
    assert await bus_jobs(app) == []


async def test_failing_inline_binding_enqueues_nothing_and_propagates(app: jobbus.App) -> None:
    bus = order_bus(app)
    later: list[int] = []

    @bus.handler(OrderPlaced)
    def reject(message: OrderPlaced) -> None:
        raise LookupError(f"order {message.order_id} is unknown")

    @bus.handler(OrderPlaced)
    def after(message: OrderPlaced) -> None:
        later.append(message.order_id)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None:
        raise AssertionError("never runs")

    with pytest.raises(LookupError, match="order 1 is unknown"):
        await bus.dispatch(OrderPlaced(1, Decimal("1")))
    assert later == []
    assert await bus_jobs(app) == []


# -- queued bindings --------------------------------------------------------------------------------


async def test_queued_bindings_run_exactly_once_each_in_a_worker(app: jobbus.App, dsn: str) -> None:
    await execute(app, "CREATE TABLE runs (binding text, order_id int, total text, job_id uuid, job_view text)")
    bus = order_bus(app)
    inline_runs: list[int] = []

    @bus.handler(OrderPlaced)
    def audit(message: OrderPlaced) -> None:
        inline_runs.append(message.order_id)

    @bus.handler(OrderPlaced, queued=True, queue="billing", name="invoice", priority=5, max_attempts=4)
    async def invoice(message: OrderPlaced, job: jobbus.JobExecution) -> dict[str, Any]:
        async with app.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO runs VALUES ('invoice', %s, %s, %s, %s)",
                (message.order_id, str(message.total), job.id, type(job).__name__),
            )
        return {"invoiced": str(message.total)}

    @bus.handler(OrderPlaced, queued=True, name="notify")
    def notify(message: OrderPlaced, job: jobbus.SyncJobExecution) -> None:
        job.checkpoint({"sent": True})
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO runs VALUES ('notify', %s, %s, %s, %s)",
                (message.order_id, str(message.total), job.id, type(job).__name__),
            )

    result = await bus.dispatch(OrderPlaced(42, Decimal("19.90")))
    assert inline_runs == [42]
    assert list(result.jobs_by_binding) == ["invoice", "notify"]

    await run_worker(app)

    runs = await execute(app, "SELECT binding, order_id, total, job_id, job_view FROM runs ORDER BY binding")
    assert runs == [
        ("invoice", 42, "19.90", result.jobs_by_binding["invoice"], "JobExecution"),
        ("notify", 42, "19.90", result.jobs_by_binding["notify"], "SyncJobExecution"),
    ]
    assert inline_runs == [42]  # the worker never dispatches again
    jobs = {job.name: job for job in await bus_jobs(app)}
    assert set(jobs) == {"invoice", "notify"}
    assert all(job.status is jobbus.JobStatus.COMPLETED and job.attempts == 1 for job in jobs.values())
    assert (jobs["invoice"].queue, jobs["invoice"].priority, jobs["invoice"].max_attempts) == ("billing", 5, 4)
    assert (jobs["notify"].queue, jobs["notify"].priority) == ("default", 0)
    assert jobs["invoice"].result == {"invoiced": "19.90"}
    assert jobs["notify"].execution_data == {"sent": True}


async def test_each_queued_binding_is_one_job_with_an_envelope(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="invoice")
    async def invoice(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="notify")
    async def notify(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    result = await bus.dispatch(OrderPlaced(3, Decimal("1.50")), headers={"tenant": "acme"})

    jobs = await bus_jobs(app)
    assert sorted(job.id for job in jobs) == sorted(result.job_ids)
    for job in jobs:
        assert job.type == f"jobbus.message:{job.name}"
        assert job.configuration_data == {
            "v": 1,
            "message": "order.placed",
            "binding": job.name,
            "codec": "json",
            "payload": {"order_id": 3, "total": "1.50"},
            "headers": {"tenant": "acme", "correlation_id": result.correlation_id},
        }


async def test_dispatch_result_lists_job_ids_in_binding_order_and_maps_them_by_binding(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="invoice")
    async def invoice(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    @bus.handler(OrderPlaced)
    def audit(message: OrderPlaced) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="notify")
    async def notify(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    result = await bus.dispatch(OrderPlaced(3, Decimal("1")))

    assert type(result.job_ids) is list and len(result.job_ids) == 2
    assert result.job_ids == list(result.jobs_by_binding.values())
    assert list(result.jobs_by_binding) == ["invoice", "notify"]  # binding order, inline bindings left out
    for binding in result.jobs_by_binding:  # a plain dict: its keys index it
        job = await app.find(result.jobs_by_binding[binding])
        assert job is not None and (job.name, job.status) == (binding, jobbus.JobStatus.QUEUED)
    for job_id in result.job_ids:  # SPEC: `result.job_ids`, one job per queued binding
        assert await app.cancel(job_id) is jobbus.JobStatus.CANCELLED
    with pytest.raises(AttributeError):
        result.correlation_id = "other"  # type: ignore[misc]


async def test_queued_handler_errors_are_retried_like_any_job(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="flaky", max_attempts=2)
    async def flaky(message: OrderPlaced, job: jobbus.JobExecution) -> None:
        raise RuntimeError(f"payment service down (attempt {job.attempt})")

    result = await bus.dispatch(OrderPlaced(1, Decimal("1")))
    await run_worker(app)

    job = await app.find(result.jobs_by_binding["flaky"])
    assert job is not None
    assert (job.status, job.attempts) == (jobbus.JobStatus.FAILED, 2)
    assert job.last_error is not None and "payment service down (attempt 2)" in job.last_error


async def test_queued_handler_can_fail_without_retry(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="strict", max_attempts=5)
    def strict(message: OrderPlaced, job: jobbus.SyncJobExecution) -> None:
        raise jobbus.NonRetryableError("order total must be positive")

    result = await bus.dispatch(OrderPlaced(1, Decimal("-1")))
    await run_worker(app)

    (job_id,) = result.job_ids
    job = await app.find(job_id)
    assert job is not None and (job.status, job.attempts) == (jobbus.JobStatus.FAILED, 1)


async def test_available_at_delays_every_queued_binding(app: jobbus.App) -> None:
    bus = order_bus(app)
    runs: list[int] = []

    @bus.handler(OrderPlaced, queued=True, name="later")
    async def later(message: OrderPlaced, job: jobbus.JobExecution) -> None:
        runs.append(message.order_id)

    result = await bus.dispatch(OrderPlaced(1, Decimal("1")), available_at=timedelta(hours=1))
    await run_worker(app)

    job = await app.find(result.jobs_by_binding["later"])
    assert job is not None and job.status is jobbus.JobStatus.QUEUED
    assert job.available_at > job.created_at + timedelta(minutes=59)
    assert runs == []


async def test_bad_dispatch_options_run_nothing_and_write_nothing(app: jobbus.App) -> None:
    bus = order_bus(app)
    inline_runs: list[int] = []

    @bus.handler(OrderPlaced)
    def audit(message: OrderPlaced) -> None:
        inline_runs.append(message.order_id)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    message = OrderPlaced(1, Decimal("1"))
    with pytest.raises(jobbus.InvalidJobError, match="aware datetime"):
        await bus.dispatch(message, available_at=datetime(2030, 1, 1))
    with pytest.raises(jobbus.InvalidJobError, match="'nope', which is not a queued binding"):
        await bus.dispatch(message, unique_key={"nope": "k"})
    with pytest.raises(jobbus.InvalidJobError, match="headers: 'n' must be a string"):
        await bus.dispatch(message, headers={"n": 1})  # type: ignore[dict-item]
    with psycopg.connect(app.dsn) as sync_conn, pytest.raises(TypeError, match="AsyncConnection"):
        await bus.dispatch(message, connection=sync_conn)  # type: ignore[arg-type]
    assert inline_runs == []
    assert await bus_jobs(app) == []


# -- a bad dispatch has no effect ----------------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    text: str


def note_bus(app: jobbus.App, inline_runs: list[str]) -> MessageBus:
    bus = MessageBus(app)
    bus.message("note.written")(Note)

    @bus.handler(Note)
    def audit(message: Note) -> None:
        inline_runs.append(message.text)

    @bus.handler(Note, queued=True, name="index")
    async def index(message: Note, job: jobbus.JobExecution) -> None: ...

    return bus


#: Dispatches whose jobs the App refuses: each must fail before any inline binding runs.
INVALID_JOBS: list[tuple[Note, dict[str, Any], str]] = [
    (Note("x" * 2000), {}, r"over the limit of 1024 \(setting max_payload_bytes\)"),
    (Note("x"), {"unique_key": "k" * 1001}, "unique_key is 1001 bytes long in UTF-8, at most 1000 are allowed"),
    (Note("x"), {"available_at": timedelta(days=10**7)}, "available_at: a delay of 10000000 days.* is out of range"),
    (
        Note("x"),
        {"available_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-20)))},
        "must land between 0002-01-01 and 9999-01-01 UTC",
    ),
]


@pytest.mark.parametrize(("message", "options", "reason"), INVALID_JOBS)
async def test_invalid_jobs_are_refused_before_any_inline_binding_runs(
    dsn: str, message: Note, options: dict[str, Any], reason: str
) -> None:
    inline_runs: list[str] = []
    async with jobbus.App(dsn=dsn, max_payload_bytes=1024) as app:
        bus = note_bus(app, inline_runs)
        with pytest.raises(jobbus.InvalidJobError, match=reason):
            await bus.dispatch(message, **options)
        assert inline_runs == []
        assert await bus_jobs(app) == []


@pytest.mark.parametrize(("message", "options", "reason"), INVALID_JOBS)
def test_invalid_jobs_are_refused_before_any_inline_binding_runs_in_sync_dispatch(
    dsn: str, message: Note, options: dict[str, Any], reason: str
) -> None:
    inline_runs: list[str] = []
    app = jobbus.App(dsn=dsn, max_payload_bytes=1024)
    with app.sync:
        bus = note_bus(app, inline_runs)
        with pytest.raises(jobbus.InvalidJobError, match=reason):
            bus.sync.dispatch(message, **options)
        assert inline_runs == []
        assert app.sync.list_jobs() == []


def test_a_valid_dispatch_after_a_refused_one_writes_its_job(sync_app: jobbus.App) -> None:
    inline_runs: list[str] = []
    bus = note_bus(sync_app, inline_runs)
    with pytest.raises(jobbus.InvalidJobError):
        bus.sync.dispatch(Note("x"), unique_key="k" * 1001)
    result = bus.sync.dispatch(Note("y"), unique_key="k" * 1000)
    assert inline_runs == ["y"]
    (job,) = sync_app.sync.list_jobs()
    assert (job.id, job.unique_key) == (result.jobs_by_binding["index"], "k" * 1000)


# -- messages JSON would change are refused at dispatch ------------------------------------------------


def exactness_bus(app: jobbus.App, inline_runs: list[object], received: list[object]) -> MessageBus:
    bus = MessageBus(app)
    for wire_name, cls in [
        ("user.logged_in", Login),
        ("profile.saved", Profile),
        ("account.opened", Account),
        ("reference.noted", Reference),
        ("reading.taken", Reading),
    ]:
        bus.message(wire_name)(cls)
        bus.handler(cls, name=f"{wire_name}.audit")(inline_runs.append)

        async def keep(message: object, job: jobbus.JobExecution) -> None:
            received.append(message)

        bus.handler(cls, queued=True, name=f"{wire_name}.keep")(keep)
    return bus


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (Login(user="ann", password=pydantic.SecretStr("hunter2")), r"message\.password does not survive JSON"),
        (Profile(name="ann", cache_key="k-1"), r"message\.cache_key does not survive JSON .* sent str 'k-1'"),
        (Reference(str(uuid.UUID(int=3))), r"str \| uuid\.UUID.*JSON cannot tell such members apart"),
        (Reading(math.nan), r"message\.value is nan: JSON has no NaN or Infinity"),
    ],
)
async def test_a_message_that_json_would_change_is_refused_at_dispatch(
    app: jobbus.App, message: object, reason: str
) -> None:
    inline_runs: list[object] = []
    bus = exactness_bus(app, inline_runs, [])
    with pytest.raises(CodecError, match=reason):
        await bus.dispatch(message)
    with pytest.raises(CodecError, match=reason):
        bus.sync.dispatch(message)
    assert inline_runs == []
    assert await bus_jobs(app) == []


async def test_aliased_models_and_nan_strings_arrive_exactly_in_a_worker(app: jobbus.App) -> None:
    received: list[object] = []
    bus = exactness_bus(app, [], received)
    sent = [Account.model_validate({"userId": 7, "displayIn": "Ann"}), Reading("NaN"), Reading(2.5)]
    for message in sent:
        await bus.dispatch(message)
    await run_worker(app)

    assert sorted(received, key=repr) == sorted(sent, key=repr)
    assert {type(message.value) for message in received if isinstance(message, Reading)} == {str, float}


# -- transactional dispatch -------------------------------------------------------------------------


async def test_dispatch_in_a_rolled_back_transaction_leaves_no_job(app: jobbus.App, dsn: str) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        result = await bus.dispatch(OrderPlaced(1, Decimal("1")), connection=conn)
        assert len(result.job_ids) == 1
        raise psycopg.Rollback()

    assert await bus_jobs(app) == []


async def test_dispatch_in_a_committed_transaction_appears_at_commit(app: jobbus.App, dsn: str) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="bill")
    async def bill(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute("CREATE TABLE orders (id int)")
        await conn.execute("INSERT INTO orders VALUES (1)")
        result = await bus.dispatch(OrderPlaced(1, Decimal("1")), connection=conn)
        assert await bus_jobs(app) == []  # other connections do not see it yet

    jobs = await bus_jobs(app)
    assert sorted(job.id for job in jobs) == sorted(result.job_ids)
    assert await execute(app, "SELECT id FROM orders") == [(1,)]


def test_sync_dispatch_joins_the_callers_sync_transaction(sync_app: jobbus.App, dsn: str) -> None:
    bus = order_bus(sync_app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    def ship(message: OrderPlaced, job: jobbus.SyncJobExecution) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="bill")
    async def bill(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    with psycopg.connect(dsn) as conn, conn.transaction():
        rolled_back = bus.sync.dispatch(OrderPlaced(1, Decimal("1")), connection=conn)
        raise psycopg.Rollback()
    assert len(rolled_back.job_ids) == 2
    assert sync_app.sync.list_jobs() == []

    with psycopg.connect(dsn) as conn, conn.transaction():
        committed = bus.sync.dispatch(OrderPlaced(2, Decimal("2")), connection=conn)
        assert sync_app.sync.list_jobs() == []
    jobs = sync_app.sync.list_jobs()
    assert sorted(job.id for job in jobs) == sorted(committed.job_ids)

    unscoped = bus.sync.dispatch(OrderPlaced(3, Decimal("3")))
    assert all(sync_app.sync.find(job_id) is not None for job_id in unscoped.job_ids)


def test_sync_dispatch_runs_sync_and_async_inline_bindings_in_order(sync_app: jobbus.App) -> None:
    bus = order_bus(sync_app)
    seen: list[str] = []

    @bus.handler(OrderPlaced)
    def first(message: OrderPlaced) -> None:
        seen.append("first")

    @bus.handler(OrderPlaced)
    async def second(message: OrderPlaced) -> None:
        seen.append(f"second:{current_correlation_id()}")

    result = bus.sync.dispatch(OrderPlaced(1, Decimal("1")), headers={"correlation_id": "c-1"})
    assert seen == ["first", "second:c-1"]
    assert result.correlation_id == "c-1"


async def test_sync_dispatch_refuses_async_inline_bindings_inside_an_event_loop(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, name="async-audit")
    async def audit(message: OrderPlaced) -> None: ...

    with pytest.raises(TypeError, match=r"async-audit are async .* use `await bus.dispatch"):
        bus.sync.dispatch(OrderPlaced(1, Decimal("1")))


# -- unique keys ------------------------------------------------------------------------------------


async def test_str_unique_key_applies_per_binding_and_deduplicates(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="bill")
    async def bill(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    first = await bus.dispatch(OrderPlaced(1, Decimal("1")), unique_key="order-1")
    again = await bus.dispatch(OrderPlaced(1, Decimal("1")), unique_key="order-1")

    assert again == dataclasses.replace(first, correlation_id=again.correlation_id)
    jobs = await bus_jobs(app)
    assert sorted((job.type, job.unique_key or "") for job in jobs) == [
        ("jobbus.message:bill", "order-1"),  # each binding has its own job type: the key is kept as given
        ("jobbus.message:ship", "order-1"),
    ]


async def test_mapping_unique_key_applies_to_the_named_bindings_only(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="bill")
    async def bill(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    first = await bus.dispatch(OrderPlaced(1, Decimal("1")), unique_key={"bill": "order-1"})
    again = await bus.dispatch(OrderPlaced(1, Decimal("1")), unique_key={"bill": "order-1"})

    assert again.jobs_by_binding["bill"] == first.jobs_by_binding["bill"]
    assert again.jobs_by_binding["ship"] != first.jobs_by_binding["ship"]
    keys = sorted((job.name or "", job.unique_key or "-") for job in await bus_jobs(app))
    assert keys == [("bill", "order-1"), ("ship", "-"), ("ship", "-")]


# -- headers and correlation ------------------------------------------------------------------------


async def test_correlation_id_is_generated_or_kept_and_travels_in_the_envelope(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    generated = await bus.dispatch(OrderPlaced(1, Decimal("1")))
    kept = await bus.dispatch(OrderPlaced(2, Decimal("1")), headers={"correlation_id": "req-7", "user": "u1"})

    assert re.fullmatch(r"[0-9a-f]{32}", generated.correlation_id)
    assert kept.correlation_id == "req-7"
    job = await app.find(kept.jobs_by_binding["ship"])
    assert job is not None and job.configuration_data["headers"] == {"correlation_id": "req-7", "user": "u1"}


async def test_messages_dispatched_while_handling_inherit_the_correlation_id(app: jobbus.App) -> None:
    bus = order_bus(app)
    bus.message("ping")(Ping)
    seen_in_worker: list[str | None] = []

    @bus.handler(OrderPlaced)
    async def ping_on_order(message: OrderPlaced) -> None:
        await bus.dispatch(Ping(message.order_id))

    @bus.handler(Ping, queued=True, name="pong")
    async def pong(message: Ping, job: jobbus.JobExecution) -> None:
        seen_in_worker.append(current_correlation_id())

    result = await bus.dispatch(OrderPlaced(5, Decimal("1")))
    await run_worker(app)

    assert seen_in_worker == [result.correlation_id]
    (job,) = await bus_jobs(app)
    assert job.configuration_data["headers"]["correlation_id"] == result.correlation_id
    assert current_correlation_id() is None


async def test_worker_log_lines_of_a_bus_job_carry_its_correlation_id(
    app: jobbus.App, caplog: pytest.LogCaptureFixture
) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    result = await bus.dispatch(OrderPlaced(1, Decimal("1")), headers={"correlation_id": "trace-42"})
    with caplog.at_level(logging.DEBUG, logger="jobbus.bus"):
        await run_worker(app)

    lines = [r for r in caplog.records if r.name == "jobbus.bus" and getattr(r, "job_id", None)]
    assert lines, "the bus logs the execution of its jobs"
    for record in lines:
        assert record.__dict__["correlation_id"] == "trace-42"
        assert record.__dict__["job_id"] == str(result.jobs_by_binding["ship"])
        assert record.__dict__["bus_binding"] == "ship"


# -- envelopes a worker cannot resolve --------------------------------------------------------------

GOOD_ENVELOPE: dict[str, Any] = {
    "v": 1,
    "message": "order.placed",
    "binding": "ship",
    "codec": "json",
    "payload": {"order_id": 1, "total": "1.00"},
    "headers": {"correlation_id": "c"},
}


SHIP = "jobbus.message:ship"
#: Cases that fail the same way under the binding's job type and under the type earlier releases stored.
ANY_TYPE_CASES: list[tuple[dict[str, Any], str]] = [
    ({"payload": {"order_id": "one", "total": "1"}}, "does not decode into tests.bus.helpers.OrderPlaced"),
    ({"payload": {"total": "1"}}, "message: Object missing required field `order_id`"),
    ({"payload": {"order_id": 1, "total": "lots"}}, "message.total: Invalid decimal string"),
    ({"message": "order.cancelled"}, "message 'order.cancelled' is not registered in this worker"),
    ({"codec": "msgpack"}, "codec 'msgpack' of message 'order.placed' is not registered"),
    ({"v": 2}, "envelope version 2 is unknown to this worker"),
    ({"message": None, "payload": None}, "not a message envelope (keys: binding, codec, headers, v)"),
    ({"message": None}, "the envelope has no valid 'message' name"),
    ({"binding": 7}, "no valid 'binding' name"),
]


@pytest.mark.parametrize(
    ("job_type", "changes", "reason"),
    [
        *[(SHIP, changes, reason) for changes, reason in ANY_TYPE_CASES],
        *[(BUS_JOB_TYPE, changes, reason) for changes, reason in ANY_TYPE_CASES],
        (SHIP, {"binding": "audit"}, "job type 'jobbus.message:ship' runs binding 'ship', but its envelope names"),
        (SHIP, {"message": "ping"}, "binding 'ship' handles message 'order.placed' in this worker, not 'ping'"),
        (BUS_JOB_TYPE, {"binding": "tests.old_module.ship"}, "binding 'tests.old_module.ship' of message 'order"),
        (BUS_JOB_TYPE, {"binding": "audit"}, "binding 'audit' is inline in this worker"),
    ],
)
async def test_unresolvable_envelope_fails_at_once_with_the_reason(
    app: jobbus.App, job_type: str, changes: dict[str, Any], reason: str
) -> None:
    bus = order_bus(app)
    bus.message("ping")(Ping)
    runs: list[int] = []

    @bus.handler(OrderPlaced, name="audit")
    def audit(message: OrderPlaced) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None:
        runs.append(message.order_id)

    envelope = {key: value for key, value in {**GOOD_ENVELOPE, **changes}.items() if value is not None}
    bad_id = await app.schedule(job_type, envelope, max_attempts=3)
    good_id = await app.schedule(job_type, GOOD_ENVELOPE)
    await run_worker(app)

    bad = await app.find(bad_id)
    assert bad is not None
    assert (bad.status, bad.attempts) == (jobbus.JobStatus.FAILED, 1)
    assert bad.last_error is not None and reason in bad.last_error
    assert EnvelopeError.__name__ in bad.last_error
    good = await app.find(good_id)
    assert good is not None and good.status is jobbus.JobStatus.COMPLETED
    assert runs == [1]


@pytest.mark.parametrize(
    ("job_type", "envelope"),
    [
        (SHIP, {"message": "order.placed", "payload": {"order_id": 9, "total": "2.5"}}),
        (BUS_JOB_TYPE, {"message": "order.placed", "binding": "ship", "payload": {"order_id": 9, "total": "2.5"}}),
    ],
)
async def test_a_hand_written_envelope_needs_only_message_binding_and_payload(
    app: jobbus.App, job_type: str, envelope: dict[str, Any]
) -> None:
    """Under the binding's own job type, the type names the binding: the envelope may leave it out."""
    bus = order_bus(app)
    runs: list[tuple[OrderPlaced, str | None]] = []

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> str:
        runs.append((message, current_correlation_id()))
        return "shipped"

    job_id = await app.schedule(job_type, envelope)
    await run_worker(app)

    assert runs == [(OrderPlaced(9, Decimal("2.5")), None)]
    job = await app.find(job_id)
    assert job is not None and (job.status, job.result) == (jobbus.JobStatus.COMPLETED, "shipped")


# -- message kinds and codecs -----------------------------------------------------------------------


async def test_typeddict_messages_name_their_type_and_decode_with_their_hints(app: jobbus.App) -> None:
    bus = MessageBus(app)
    bus.message("invoice.due")(Invoice)
    received: list[Invoice] = []

    @bus.handler(Invoice, queued=True, name="remind")
    async def remind(message: Invoice, job: jobbus.JobExecution) -> None:
        received.append(message)

    due = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)
    with pytest.raises(TypeError, match="pass message_type="):
        await bus.dispatch(Invoice(number="A-1", due=due))
    await bus.dispatch(Invoice(number="A-1", due=due), message_type=Invoice)
    await bus.dispatch(Invoice(number="A-2", due=due), message_type="invoice.due")
    await run_worker(app)

    assert sorted(received, key=lambda m: m["number"]) == [
        {"number": "A-1", "due": due},
        {"number": "A-2", "due": due},
    ]


async def test_pydantic_messages_round_trip_through_a_worker(app: jobbus.App) -> None:
    bus = MessageBus(app)
    bus.message("user.signed_up")(Signup)
    received: list[Signup] = []

    @bus.handler(Signup, queued=True, name="welcome")
    async def welcome(message: Signup, job: jobbus.JobExecution) -> None:
        received.append(message)

    sent = Signup(email="a@example.com", at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), credit=Decimal("10.50"))
    await bus.dispatch(sent)
    await run_worker(app)

    assert received == [sent]
    assert str(received[0].credit) == "10.50"


async def test_worker_decodes_with_the_codec_the_envelope_names(app: jobbus.App, dsn: str) -> None:
    producer = MessageBus(app)
    producer.message("ping", codec=PingTextCodec())(Ping)

    @producer.handler(Ping, queued=True, name="pong")
    async def pong_producer_side(message: Ping, job: jobbus.JobExecution) -> None: ...

    result = await producer.dispatch(Ping(12))
    job = await app.find(result.jobs_by_binding["pong"])
    assert job is not None and job.configuration_data["codec"] == "ping-text"
    assert job.configuration_data["payload"] == "ping:12"

    # A later release of the worker encodes Ping with JSON, but still knows the codec of old envelopes.
    worker_app = jobbus.App(dsn=dsn, poll_interval_seconds=0.2)
    worker_bus = MessageBus(worker_app, codecs=[PingTextCodec()])
    worker_bus.message("ping")(Ping)
    received: list[Ping] = []

    @worker_bus.handler(Ping, queued=True, name="pong")
    async def pong_worker_side(message: Ping, job: jobbus.JobExecution) -> None:
        received.append(message)

    await run_worker(worker_app)
    assert received == [Ping(12)]


async def test_unencodable_message_is_refused_before_anything_runs(app: jobbus.App) -> None:
    bus = MessageBus(app)
    bus.message("opaque")(Opaque)
    bus.message("ping")(Ping)
    inline_runs: list[object] = []

    @bus.handler(Opaque)
    def audit(message: Opaque) -> None:
        inline_runs.append(message)

    @bus.handler(Opaque, queued=True, name="store")
    async def store(message: Opaque, job: jobbus.JobExecution) -> None: ...

    @bus.handler(Ping, queued=True, name="pong")
    async def pong(message: Ping, job: jobbus.JobExecution) -> None: ...

    with pytest.raises(CodecError, match=r"message\.thing: cannot encode builtins\.object values"):
        await bus.dispatch(Opaque(object()))
    with pytest.raises(CodecError, match=r"message 'ping' cannot travel as JSON .* message\.n: Expected `int`"):
        await bus.dispatch(Ping("twelve"))  # type: ignore[arg-type]
    assert inline_runs == []
    assert await bus_jobs(app) == []


# -- registration -----------------------------------------------------------------------------------


async def test_registration_errors_are_raised_at_decoration_time(app: jobbus.App) -> None:
    bus = order_bus(app)

    @dataclass
    class Unregistered:
        x: int

    with pytest.raises(ValueError, match=re.escape("is already registered for tests.bus.helpers.OrderPlaced")):
        bus.message("order.placed")(Ping)
    with pytest.raises(ValueError, match=re.escape("OrderPlaced is already registered as message 'order.placed'")):
        bus.message("order.created")(OrderPlaced)
    with pytest.raises(ValueError, match=re.escape("Unregistered is not a registered message: decorate the class")):
        bus.handler(Unregistered)
    with pytest.raises(ValueError, match=re.escape("no message is registered under the wire name 'order.shipped'")):
        bus.handler("order.shipped")
    with pytest.raises(TypeError, match="decorates a class"):
        bus.message("not.a.class")(len)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="message name must be a non-empty string"):
        bus.message(" ")
    with pytest.raises(ValueError, match="queue, priority only apply to queued bindings"):
        bus.handler(OrderPlaced, queue="q", priority=1)
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        bus.handler(OrderPlaced, queued=True, name="never", max_attempts=0)(lambda message, job: None)
    with pytest.raises(ValueError, match="queue must not be empty"):
        bus.handler(OrderPlaced, queued=True, name="never", queue=" ")(lambda message, job: None)

    @bus.handler(OrderPlaced, queued=True, name="ship")
    async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    with pytest.raises(ValueError, match="binding name 'ship' is already used by"):
        bus.handler(OrderPlaced, name="ship")(lambda message: None)
    with pytest.raises(TypeError, match=r"cannot be called as \(message, job\)"):

        @bus.handler(OrderPlaced, queued=True, name="one-arg")
        async def one_arg(message: OrderPlaced) -> None: ...

    with pytest.raises(TypeError, match=r"cannot be called as \(message\)"):

        @bus.handler(OrderPlaced, name="two-args")
        def two_args(message: OrderPlaced, extra: int) -> None: ...

    assert set(bus.bindings) == {"ship"}


async def test_default_binding_names_come_from_module_and_qualname_and_must_be_unique(app: jobbus.App) -> None:
    bus = order_bus(app)

    def audit(message: OrderPlaced) -> None: ...

    bus.handler(OrderPlaced)(audit)
    expected = f"{__name__}.test_default_binding_names_come_from_module_and_qualname_and_must_be_unique.<locals>.audit"
    assert list(bus.bindings) == [expected]
    with pytest.raises(ValueError, match="pass name= to give this binding its own stable name"):
        bus.handler(OrderPlaced)(audit)
    bus.handler(OrderPlaced, name="audit-again")(audit)
    assert list(bus.bindings) == [expected, "audit-again"]


async def test_one_message_bus_per_app(app: jobbus.App) -> None:
    MessageBus(app)
    with pytest.raises(ValueError, match=r"already has a MessageBus .* one MessageBus per App"):
        MessageBus(app)


async def test_codec_registry_refuses_clashing_names_and_non_codecs(app: jobbus.App) -> None:
    class OtherJson(JsonCodec):
        pass

    bus = MessageBus(app, codecs=[PingTextCodec()])
    assert set(bus.codecs) == {"json", "ping-text"}
    bus.register_codec(PingTextCodec())  # the same kind of codec again is fine
    with pytest.raises(ValueError, match="codec name 'json' is already taken"):
        bus.register_codec(OtherJson())
    with pytest.raises(TypeError, match="a codec needs a non-empty str `name`"):
        bus.register_codec(object())  # type: ignore[arg-type]


async def test_dispatching_an_unregistered_object_says_how_to_register_it(app: jobbus.App) -> None:
    bus = order_bus(app)
    with pytest.raises(TypeError, match="Ping is not a registered message"):
        await bus.dispatch(Ping(1))
    with pytest.raises(TypeError, match=re.escape("='order.placed' expects tests.bus.helpers.OrderPlaced")):
        await bus.dispatch(Ping(1), message_type="order.placed")


# -- real worker processes --------------------------------------------------------------------------


async def test_renamed_message_class_still_decodes_old_envelopes_in_a_worker_process(dsn: str) -> None:
    producer, bus = build("v1", dsn)
    moved_at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    async with producer:
        await execute(producer, RECORD_TABLE)
        result = await bus.dispatch(AddressChanged(7, "Main St 1", moved_at, Decimal("100.00")))

        code, log = await run_worker_process("v2", dsn)  # the next release renamed the class

        assert code == 0, log
        rows = await execute(
            producer,
            "SELECT binding, message_class, customer_id, address, moved_at, deposit, job_id, job_view, attempt,"
            " correlation_id, pid FROM bus_record ORDER BY binding",
        )
        jobs = {job.name: job for job in await producer.list_jobs()}

    when = f"{moved_at.isoformat()} UTC"
    cid = result.correlation_id
    assert [row[:10] for row in rows] == [
        ("crm.sync", "CustomerRelocated", 7, "Main St 1", when, "100.00", result.jobs_by_binding["crm.sync"],
         "SyncJobExecution", 1, cid),
        ("geocode", "CustomerRelocated", 7, "Main St 1", when, "100.00", result.jobs_by_binding["geocode"],
         "JobExecution", 1, cid),
    ]  # fmt: skip
    assert all(row[10] != os.getpid() for row in rows)
    assert {name: job.status for name, job in jobs.items()} == {
        "geocode": jobbus.JobStatus.COMPLETED,
        "crm.sync": jobbus.JobStatus.COMPLETED,
    }
    assert jobs["geocode"].result == {"customer_id": 7, "handled_by": "CustomerRelocated"}
    assert jobs["geocode"].configuration_data["message"] == WIRE_NAME
    assert f"correlation={cid} " in log


async def test_concurrent_worker_processes_run_each_binding_exactly_once(dsn: str) -> None:
    producer, bus = build("v1", dsn)
    moved_at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    async with producer:
        await execute(producer, RECORD_TABLE)
        dispatched = [await bus.dispatch(AddressChanged(n, f"Street {n}", moved_at, Decimal(n))) for n in range(25)]

        outcomes = await asyncio.gather(*(run_worker_process("v1", dsn) for _ in range(3)))

        assert all(code == 0 for code, _ in outcomes), [log for _, log in outcomes]
        rows = await execute(producer, "SELECT job_id, count(*) FROM bus_record GROUP BY job_id")
        statuses = {job.status for job in await producer.list_jobs(limit=1000)}

    expected = {job_id for result in dispatched for job_id in result.job_ids}
    assert len(expected) == 50
    assert dict(rows) == dict.fromkeys(expected, 1)
    assert statuses == {jobbus.JobStatus.COMPLETED}
