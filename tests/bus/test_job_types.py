"""Each queued binding is its own job type, run by a real worker: rolling deploys, stored jobs, threads."""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import jobbus
from jobbus.bus import BUS_JOB_TYPE, MAX_BINDING_NAME_BYTES, MessageBus, binding_job_type, current_correlation_id
from tests.bus.helpers import OrderPlaced, bus_jobs, order_bus, run_worker
from tests.conftest import FAST

# -- the job type of a queued binding ------------------------------------------------------------------


async def test_each_queued_binding_registers_its_own_job_type(app: jobbus.App) -> None:
    bus = order_bus(app)

    @bus.handler(OrderPlaced)
    def audit(message: OrderPlaced) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="invoice", queue="billing", priority=3, max_attempts=7)
    async def invoice(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    @bus.handler(OrderPlaced, queued=True, name="notify")
    def notify(message: OrderPlaced, job: jobbus.SyncJobExecution) -> None: ...

    assert binding_job_type("invoice") == "jobbus.message:invoice" == bus.bindings["invoice"].job_type
    assert sorted(app.handlers) == [BUS_JOB_TYPE, "jobbus.message:invoice", "jobbus.message:notify"]
    assert app.handlers["jobbus.message:invoice"].is_async
    assert not app.handlers["jobbus.message:notify"].is_async  # a sync binding is a sync handler
    defaults = app.job_defaults("jobbus.message:invoice")
    assert (defaults.queue, defaults.priority, defaults.max_attempts) == ("billing", 3, 7)

    result = await bus.dispatch(OrderPlaced(1, Decimal("1")))
    jobs = {job.name: job for job in await bus_jobs(app)}
    assert {name: job.type for name, job in jobs.items()} == {
        "invoice": "jobbus.message:invoice",
        "notify": "jobbus.message:notify",
    }
    assert (jobs["invoice"].queue, jobs["invoice"].priority, jobs["invoice"].max_attempts) == ("billing", 3, 7)
    assert [jobs["invoice"].id, jobs["notify"].id] == result.job_ids


async def test_binding_names_fit_the_job_type_limit(app: jobbus.App) -> None:
    bus = order_bus(app)
    longest = "é" * (MAX_BINDING_NAME_BYTES // 2)  # two bytes each in UTF-8

    @bus.handler(OrderPlaced, queued=True, name=longest)
    async def fits(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    assert len(binding_job_type(longest).encode()) <= 255
    with pytest.raises(ValueError, match=r"is 242 bytes in UTF-8, at most 240 are allowed: .* job types"):
        bus.handler(OrderPlaced, queued=True, name="é" * 121)(lambda message, job: None)
    await bus.dispatch(OrderPlaced(1, Decimal("1")))
    (job,) = await bus_jobs(app)
    assert job.type == f"jobbus.message:{longest}"


async def test_a_binding_whose_job_type_is_taken_is_refused_and_not_registered(app: jobbus.App) -> None:
    bus = order_bus(app)

    @app.job("jobbus.message:ship")
    async def someone_elses(job: jobbus.JobExecution) -> None: ...

    with pytest.raises(ValueError, match=r"job type 'jobbus\.message:ship' already has a handler"):

        @bus.handler(OrderPlaced, queued=True, name="ship")
        async def ship(message: OrderPlaced, job: jobbus.JobExecution) -> None: ...

    assert "ship" not in bus.bindings


# -- rolling deploys -----------------------------------------------------------------------------------


def release(dsn: str, bindings: list[str], runs: list[tuple[str, int]]) -> tuple[jobbus.App, MessageBus]:
    """One release of a service: the same message, with the given queued bindings."""
    app = jobbus.App(dsn=dsn, **FAST)
    bus = order_bus(app)
    for name in bindings:

        async def handle(message: OrderPlaced, job: jobbus.JobExecution, name: str = name) -> None:
            runs.append((name, message.order_id))

        bus.handler(OrderPlaced, queued=True, name=name)(handle)
    return app, bus


async def test_a_worker_without_a_binding_leaves_its_jobs_queued_for_one_that_has_it(dsn: str) -> None:
    runs: list[tuple[str, int]] = []
    producer, bus = release(dsn, ["ship", "bill"], runs)  # release 2 added the binding "bill"
    async with producer:
        result = await bus.dispatch(OrderPlaced(42, Decimal("9.90")))

        old_worker, _ = release(dsn, ["ship"], runs)  # release 1, still running during the deploy
        await run_worker(old_worker)

        assert runs == [("ship", 42)]
        bill = await producer.find(result.jobs_by_binding["bill"])
        assert bill is not None and (bill.status, bill.attempts, bill.last_error) == (jobbus.JobStatus.QUEUED, 0, None)

        new_worker, _ = release(dsn, ["ship", "bill"], runs)
        await run_worker(new_worker)

        assert runs == [("ship", 42), ("bill", 42)]
        statuses = {job.name: job.status for job in await bus_jobs(producer)}
        assert statuses == {"ship": jobbus.JobStatus.COMPLETED, "bill": jobbus.JobStatus.COMPLETED}


# -- jobs stored under the single type of earlier releases ------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """A message whose payload, as the earlier codec wrote it, holds forms msgspec alone refuses."""

    taken_at: datetime
    values: tuple[float, ...]
    window: timedelta
    sensor: uuid.UUID
    amount: Decimal


#: Written by the earlier, hand-written codec: a zone name after the datetime, floats as strings.
STORED_PAYLOAD: dict[str, Any] = {
    "taken_at": "2026-10-25T02:30:00+01:00[Europe/Paris]",
    "values": ["Infinity", "-0.0", 1e300, 0.1],
    "window": "-P0DT5400.000001S",
    "sensor": "00000000-0000-0000-0000-000000000007",
    "amount": "-0.00",
}
STORED_MESSAGE = Reading(
    taken_at=datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")),
    values=(math.inf, -0.0, 1e300, 0.1),
    window=-timedelta(seconds=5400, microseconds=1),
    sensor=uuid.UUID(int=7),
    amount=Decimal("-0.00"),
)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_jobs_stored_under_the_single_bus_type_still_run(app: jobbus.App, kind: str) -> None:
    bus = MessageBus(app)
    bus.message("sensor.read")(Reading)
    received: list[tuple[Reading, str | None, str]] = []

    if kind == "async":

        @bus.handler(Reading, queued=True, name="store")
        async def store_async(message: Reading, job: jobbus.JobExecution) -> str:
            received.append((message, current_correlation_id(), type(job).__name__))
            return "stored"

    else:

        @bus.handler(Reading, queued=True, name="store")
        def store_sync(message: Reading, job: jobbus.SyncJobExecution) -> str:
            job.progress(1, 1)
            received.append((message, current_correlation_id(), type(job).__name__))
            return "stored"

    envelope = {
        "v": 1,
        "message": "sensor.read",
        "binding": "store",
        "codec": "json",
        "payload": STORED_PAYLOAD,
        "headers": {"correlation_id": "stored-1"},
    }
    job_id = await app.schedule(BUS_JOB_TYPE, envelope, name="store")
    await run_worker(app)

    job = await app.find(job_id)
    assert job is not None and (job.status, job.result) == (jobbus.JobStatus.COMPLETED, "stored")
    ((message, correlation_id, view),) = received
    assert message == STORED_MESSAGE and str(message.amount) == "-0.00"
    assert message.taken_at.tzinfo == ZoneInfo("Europe/Paris") and message.taken_at.fold == 1
    assert correlation_id == "stored-1"
    assert view == ("JobExecution" if kind == "async" else "SyncJobExecution")


# -- sync bindings run in the worker's threads -------------------------------------------------------------


async def test_sync_bindings_share_the_workers_threads_and_its_concurrency(app: jobbus.App) -> None:
    """Sync bindings and sync job handlers run in the same `concurrency` threads, never more at once."""
    bus = order_bus(app)
    lock = threading.Lock()
    running = [0]
    peak = [0]
    threads: dict[str, set[str]] = {"binding": set(), "handler": set()}

    def slow(kind: str) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            threads[kind].add(threading.current_thread().name)
        time.sleep(0.2)
        with lock:
            running[0] -= 1

    @bus.handler(OrderPlaced, queued=True, name="slow")
    def slow_binding(message: OrderPlaced, job: jobbus.SyncJobExecution) -> None:
        slow("binding")

    @app.job("report.render")
    def slow_handler(job: jobbus.SyncJobExecution) -> None:
        slow("handler")

    for n in range(6):
        await bus.dispatch(OrderPlaced(n, Decimal(n)))
    await app.schedule_many("report.render", [{}] * 6)
    await run_worker(app, concurrency=2)

    assert peak[0] == 2
    assert len(threads["binding"] | threads["handler"]) <= 2, threads
    assert all(job.status is jobbus.JobStatus.COMPLETED for job in await app.list_jobs())
