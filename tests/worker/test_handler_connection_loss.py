"""A dropped connection never fails a handler's call (SPEC 1): checkpoint, progress, heartbeat, steps,
durable waits and spawns ride out a terminated backend while the attempt's lease holds, and a call
whose commit went through before its answer was lost gives the same outcome when it runs again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus.worker.runtime import Worker
from tests.conftest import FAST
from tests.cutting_proxy import CuttingProxy

#: The test's own reads carry this name: the drops leave them alone.
READER = "test-reader"
#: Every other client backend of the test database: the worker's pools, its listener, the App's pool.
OTHERS = (
    "SELECT pid FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    f" AND application_name <> '{READER}'"
)


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, application_name=READER) as conn:
        return conn.execute(sql.encode(), params).fetchall()


def drop_connections(dsn: str) -> None:
    """What a failover or a restarted PgBouncer does: every connection to the database is terminated
    (and gone when this returns)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [pid for (pid,) in conn.execute(OTHERS).fetchall()]
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "terminated backends did not go away"
            time.sleep(0.01)


@dataclass(frozen=True)
class Call:
    """A handler's call under test: `before` puts a connection in the handler pool (the one that is
    dropped), `call` is the call itself; both work on a `JobExecution` (awaited) and on a
    `SyncJobExecution`. `marks` find the call's statement in the wire protocol."""

    call: Callable[[Any], Any]
    marks: tuple[bytes, ...]
    before: Callable[[Any], Any] = lambda job: job.heartbeat()


CALLS = {
    "checkpoint": Call(lambda job: job.checkpoint({"done": 3}), (b"SET execution_data",)),
    "progress": Call(lambda job: job.progress(3, 4), (b"SET progress_current",)),
    "heartbeat": Call(
        lambda job: job.heartbeat(), (b"SET lease_expires_at", b"WHERE id ="), before=lambda job: job.progress(0)
    ),
    "steps-read": Call(lambda job: job.step("charge", charge, job.id), (b"SELECT name, result FROM",)),
    "step": Call(lambda job: job.step("charge", charge, job.id), (b"ON CONFLICT (job_id, name) DO NOTHING",)),
    "sleep": Call(lambda job: job.sleep("nap", 0.3), (b".sleep_job(",)),
    "event": Call(lambda job: job.wait_for_event("paid", timeout=0.3), (b".wait_for_event(",)),
    "spawn": Call(lambda job: job.spawn("child", {"n": 1}), (b".spawn_child(",)),
    "children": Call(
        lambda job: job.wait_for_children(), (b".wait_for_children(",), before=lambda job: job.spawn("child", {"n": 1})
    ),
    "snapshot": Call(
        lambda job: job.wait_for_children(), (b".children_snapshot(",), before=lambda job: job.spawn("child", {"n": 1})
    ),
}
#: What each call kind's job returns once it completed.
RESULTS: dict[str, Any] = {"checkpoint": None, "progress": None, "heartbeat": None, "steps-read": "paid"}
RESULTS |= {"step": "paid", "sleep": None, "event": "timed out", "spawn": "child", "children": [2], "snapshot": [2]}

#: Side effects of steps, by job id: each must run once.
charged: list[str] = []
#: The DSN a step's side effect terminates every connection of (None: it does not).
DROP_IN_STEP: list[str] = []


def charge(job_id: Any) -> str:
    charged.append(str(job_id))
    for dsn in DROP_IN_STEP:
        drop_connections(dsn)  # the step's result is then stored on a dropped connection
    return "paid"


def plain(value: Any) -> Any:
    """A call's answer as the job's JSON result."""
    if isinstance(value, list):
        return [child.result for child in value]
    if value is not None and not isinstance(value, str):
        return "child"  # a spawned child's id
    return value


def register(app: jobbus.App, hook: Callable[[str], None], seen: list[str]) -> None:
    """Jobs `async-call` and `sync-call`: `before`, then `hook(kind)`, then the call; one attempt only,
    so a call that fails ends the job `failed`. `seen` gets what the call raised."""

    async def run_async(job: jobbus.JobExecution) -> Any:
        kind = job.configuration["kind"]
        await CALLS[kind].before(job)
        await asyncio.to_thread(hook, kind)
        try:
            return plain(await CALLS[kind].call(job))
        except TimeoutError:
            return "timed out"
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise

    def run_sync(job: jobbus.SyncJobExecution) -> Any:
        kind = job.configuration["kind"]
        CALLS[kind].before(job)
        hook(kind)
        try:
            return plain(CALLS[kind].call(job))
        except TimeoutError:
            return "timed out"
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise

    app.job("async-call", max_attempts=1)(run_async)
    app.job("sync-call", max_attempts=1)(run_sync)

    @app.job("child")
    async def child(job: jobbus.JobExecution) -> int:
        await asyncio.sleep(1)  # still running when its parent waits: the parent parks
        return 2


@contextlib.asynccontextmanager
async def running(app: jobbus.App) -> AsyncIterator[Worker]:
    worker = Worker(app, concurrency=2, install_signal_handlers=False)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


async def finished(dsn: str, job_id: Any, timeout: float = 30) -> tuple[str, Any, int, list[str]]:
    """(status, result, attempts, outcomes of its history) once the job is terminal; read on a fresh
    connection, whatever happens to the App's."""
    deadline = time.monotonic() + timeout
    while True:
        rows = query(dsn, "SELECT status, result, attempts, history FROM jobbus.job WHERE id = %s", (job_id,))
        status, result, attempts, history = rows[0]
        if status in ("completed", "failed", "cancelled"):
            return status, result, attempts, [entry["outcome"] for entry in history]
        assert time.monotonic() < deadline, f"job still {status} after {timeout} s"
        await asyncio.sleep(0.05)


def children_of(dsn: str, job_id: Any) -> int:
    return int(query(dsn, "SELECT count(*) FROM jobbus.job_child WHERE parent_id = %s", (job_id,))[0][0])


def check_effects(dsn: str, kind: str, job_id: Any) -> None:
    if kind in ("steps-read", "step"):
        assert charged == [str(job_id)]  # the side effect ran once
        assert query(dsn, "SELECT result FROM jobbus.job_step WHERE job_id = %s", (job_id,)) == [("paid",)]
    if kind in ("spawn", "children", "snapshot"):
        assert children_of(dsn, job_id) == 1
    if kind == "checkpoint":
        assert query(dsn, "SELECT execution_data FROM jobbus.job WHERE id = %s", (job_id,)) == [({"done": 3},)]
    if kind == "progress":
        assert query(dsn, "SELECT progress_current FROM jobbus.job WHERE id = %s", (job_id,)) == [(3.0,)]


KINDS = [k for k in CALLS if k != "snapshot"]  # a wait's snapshot needs its answer lost, not its connection
WAITS = ("sleep", "event", "children")


@pytest.mark.parametrize("handler", ["async-call", "sync-call"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_handler_call_rides_out_its_terminated_connection(dsn: str, kind: str, handler: str) -> None:
    """Every connection is terminated right before the call (a step's: also inside its function, so its
    result is stored on a dropped connection): the job completes in its only attempt."""
    charged.clear()
    DROP_IN_STEP[:] = [dsn] if kind == "step" else []
    seen: list[str] = []
    async with jobbus.App(dsn=dsn, **FAST) as app:
        register(app, lambda _: drop_connections(dsn), seen)
        job_id = await app.schedule(handler, {"kind": kind})
        async with running(app):
            status, result, attempts, outcomes = await finished(dsn, job_id)
    DROP_IN_STEP.clear()
    assert (status, result, attempts) == ("completed", RESULTS[kind], 1), (outcomes, seen)
    assert outcomes == (["waiting", "completed"] if kind in WAITS else ["completed"])
    check_effects(dsn, kind, job_id)


@pytest.mark.server("the proxy reaches the server over TCP; the embedded server listens on a Unix socket only")
@pytest.mark.parametrize("handler", ["async-call", "sync-call"])
@pytest.mark.parametrize("kind", list(CALLS))
async def test_a_handler_call_whose_answer_was_lost_after_its_commit_has_the_same_outcome(
    dsn: str, kind: str, handler: str
) -> None:
    """The call's statement commits, then its connection drops before the answer arrives: run again, it
    answers the same (a step stored once, one child), and a wait that parked the job is told so."""
    charged.clear()
    seen: list[str] = []
    proxy = CuttingProxy(dsn)
    await proxy.start()
    try:
        async with jobbus.App(dsn=proxy.dsn, **FAST) as app:
            register(app, lambda kind: proxy.arm(*CALLS[kind].marks) if not proxy.cut else None, seen)
            job_id = await app.schedule(handler, {"kind": kind})
            async with running(app):
                status, result, attempts, outcomes = await finished(dsn, job_id)
    finally:
        await proxy.close()
    assert proxy.cut == [CALLS[kind].marks[0]]
    assert (status, result, attempts) == ("completed", RESULTS[kind], 1), (outcomes, seen)
    assert outcomes == (["waiting", "completed"] if kind in (*WAITS, "snapshot") else ["completed"])
    # A wait whose park committed tells its handler that it parked, as it would have without the cut.
    assert seen == (["JobParked"] if kind in (*WAITS, "snapshot") else [])
    check_effects(dsn, kind, job_id)


@pytest.mark.server("the proxy reaches the server over TCP; the embedded server listens on a Unix socket only")
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_call_that_cannot_get_through_before_the_lease_ends_raises_lease_lost(dsn: str, sync: bool) -> None:
    """The database is unreachable for longer than the lease: the call gives up once the lease has surely
    ended, with `LeaseLostError` (its outcome is not written), and the recovered job runs again."""
    seen: list[str] = []
    proxy = CuttingProxy(dsn)
    await proxy.start()
    loop = asyncio.get_running_loop()

    async def black_out_for(seconds: float) -> None:
        proxy.black_out()
        loop.call_later(seconds, proxy.black_out, False)

    try:
        async with jobbus.App(dsn=proxy.dsn, lease_seconds=2, **FAST) as app:

            @app.job("async-cut", max_attempts=2)
            async def cut(job: jobbus.JobExecution) -> int:
                await job.progress(0)
                if job.attempt == 1:
                    await black_out_for(4)
                try:
                    await job.checkpoint({"done": 1})
                except BaseException as exc:
                    seen.append(type(exc).__name__)
                    raise
                return job.attempt

            @app.job("sync-cut", max_attempts=2)
            def cut_sync(job: jobbus.SyncJobExecution) -> int:
                job.progress(0)
                if job.attempt == 1:
                    asyncio.run_coroutine_threadsafe(black_out_for(4), loop).result()
                try:
                    job.checkpoint({"done": 1})
                except BaseException as exc:
                    seen.append(type(exc).__name__)
                    raise
                return job.attempt

            job_id = await app.schedule("sync-cut" if sync else "async-cut")
            async with running(app):
                status, result, attempts, outcomes = await finished(dsn, job_id, timeout=60)
    finally:
        await proxy.close()
    assert seen == ["LeaseLostError"]
    assert (status, result, attempts) == ("completed", 2, 2), outcomes
    assert query(dsn, "SELECT execution_data FROM jobbus.job WHERE id = %s", (job_id,)) == [({"done": 1},)]


async def test_a_call_through_an_execution_kept_past_its_attempt_is_not_retried(dsn: str) -> None:
    """A handler that keeps its `JobExecution` and uses it once the attempt is over, on a dropped
    connection: the call fails at once with `LeaseLostError` (no retry for an attempt that ended)."""
    kept: list[jobbus.JobExecution] = []
    async with jobbus.App(dsn=dsn, **FAST) as app:

        @app.job("keeper")
        async def keeper(job: jobbus.JobExecution) -> None:
            await job.heartbeat()  # a connection in the handlers' pool, which the drop breaks
            kept.append(job)

        job_id = await app.schedule("keeper")
        async with running(app):
            assert (await finished(dsn, job_id))[0] == "completed"
            await asyncio.sleep(0.1)  # the attempt's end, after its outcome's write
            drop_connections(dsn)
            started = time.monotonic()
            with pytest.raises(jobbus.LeaseLostError, match="after its attempt ended"):
                await kept[0].stored_step("late")
            assert time.monotonic() - started < 1
