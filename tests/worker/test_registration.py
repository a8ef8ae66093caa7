"""Registration: one live process holds a worker id; a gone holder on this host is taken over at once."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import psycopg
import pytest

import jobbus
from jobbus.store import Statement, WorkerStore, run_async
from jobbus.worker.registration import Registrar, WorkerIdInUseError
from tests.processes import eventually, query
from tests.storehelpers import registration

T = TypeVar("T")
WORKER = "w-reg"
HOST = socket.gethostname()
#: Another live worker, on another host, takes the id.
TAKEN = (
    "UPDATE jobbus.worker SET instance_id = gen_random_uuid(), host = 'elsewhere', last_seen_at = now() WHERE id = %s"
)


def _registrar(
    app: jobbus.App, *, host: str = HOST, pid: int | None = None, taken: list[WorkerIdInUseError] | None = None
) -> Registrar:
    async def run(statement: Statement[T]) -> T:
        async with app.pool.connection() as conn:
            return await run_async(conn, statement)

    async def at_once(call: Callable[[], Awaitable[Any]]) -> Any:
        return await call()

    # Live until 15 s of silence: each test is done long before, however loaded the machine.
    pid = os.getpid() if pid is None else pid
    live = replace(registration(WORKER, uuid.uuid4()), host=host, pid=pid, dead_after_seconds=15.0)
    workers = WorkerStore(app.settings.schema, app.store.channel, app.store.control_channel)
    return Registrar(
        live,
        workers=workers,
        run=run,
        starting=at_once,
        on_id_taken=(taken if taken is not None else []).append,
    )


def _gone_pid() -> int:
    """The pid of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _execute(dsn: str, statement: str) -> None:
    """`statement` on the worker's row, `%s` being its id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), (WORKER,))


def _holder(dsn: str) -> tuple[Any, ...]:
    (row,) = query(dsn, "SELECT instance_id, host, pid FROM jobbus.worker WHERE id = %s", (WORKER,))
    return row


async def test_an_id_held_by_a_live_process_is_refused_naming_its_holder(app: jobbus.App, dsn: str) -> None:
    holder = _registrar(app, pid=os.getppid())  # a live process of this host, not this one
    await holder.register()
    with pytest.raises(WorkerIdInUseError) as refused:
        await _registrar(app).register()
    message = str(refused.value)
    assert f"worker id {WORKER!r} is in use by a live worker (host {HOST}, pid {os.getppid()}" in message
    assert "--worker-id" in message
    assert _holder(dsn) == (holder.registration.instance_id, HOST, os.getppid())


async def test_an_id_held_by_a_gone_process_of_this_host_is_taken_over_at_once(app: jobbus.App, dsn: str) -> None:
    await _registrar(app, pid=_gone_pid()).register()
    successor = _registrar(app)
    await successor.register()
    assert _holder(dsn) == (successor.registration.instance_id, HOST, os.getpid())


async def test_an_id_held_on_another_host_is_refused_until_its_row_goes_silent(app: jobbus.App, dsn: str) -> None:
    holder = _registrar(app, host="elsewhere", pid=_gone_pid())  # no such process here says nothing there
    await holder.register()
    contender = _registrar(app)
    with pytest.raises(WorkerIdInUseError):
        await contender.register()
    assert _holder(dsn)[0] == holder.registration.instance_id
    _execute(dsn, "UPDATE jobbus.worker SET last_seen_at = now() - interval '1 hour' WHERE id = %s")
    await contender.register()
    assert _holder(dsn)[0] == contender.registration.instance_id


async def test_a_lost_row_is_registered_again_and_an_id_taken_meanwhile_is_reported(app: jobbus.App, dsn: str) -> None:
    taken: list[WorkerIdInUseError] = []
    registrar = _registrar(app, taken=taken)
    await registrar.register()
    _execute(dsn, "DELETE FROM jobbus.worker WHERE id = %s")
    await registrar.register_again()
    assert _holder(dsn)[0] == registrar.registration.instance_id and taken == []
    _execute(dsn, TAKEN)
    await registrar.register_again()
    assert len(taken) == 1 and "host elsewhere" in str(taken[0])
    assert _holder(dsn)[1] == "elsewhere"


async def test_a_running_worker_registers_again_when_its_row_vanishes_and_exits_78_once_its_id_is_taken(
    dsn: str,
) -> None:
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.1)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        worker = jobbus.Worker(app, worker_id=WORKER)
        task = worker.start()
        await worker.ready()
        _execute(dsn, "DELETE FROM jobbus.worker WHERE id = %s")  # its row vanished: taken again
        await eventually(lambda: query(dsn, "SELECT 1 FROM jobbus.worker WHERE id = %s", (WORKER,)), timeout=10)
        assert _holder(dsn)[0] == worker.instance_id and not task.done()
        _execute(dsn, TAKEN)
        assert await asyncio.wait_for(task, 10) == 78


async def test_a_worker_whose_row_vanished_stores_its_periodic_jobs_again(dsn: str) -> None:
    """A failover to a standby that was behind loses what a worker stored at its start: its registry
    row and the periodic jobs its code declares. Both come back without a restart."""
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.1)
    app.periodic("nightly", type="t", cron="0 3 * * *")

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        worker = jobbus.Worker(app, worker_id=WORKER)
        task = worker.start()
        await worker.ready()
        assert query(dsn, "SELECT name FROM jobbus.periodic") == [("nightly",)]
        _execute(dsn, "DELETE FROM jobbus.worker WHERE id = %s")
        assert query(dsn, "DELETE FROM jobbus.periodic RETURNING name") == [("nightly",)]
        await eventually(lambda: query(dsn, "SELECT name FROM jobbus.periodic"), timeout=10, what="the periodic job")
        assert query(dsn, "SELECT name FROM jobbus.periodic") == [("nightly",)]
        assert _holder(dsn)[0] == worker.instance_id and not task.done()
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
