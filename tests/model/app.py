"""The handlers of the model check, loaded by its worker processes (`--app tests.model.app:app`).

Every handler run writes a `start` and an `end` row to `public.model_log`, every step side effect an
`effect` row, every received event a `received` row, and every completion the worker reports (the
`JobCompleted` event, after its commit) a `completed` row. Rows are written on the process's own
autocommit connection and stamped by the database clock (`clock_timestamp()`), so runs of different
processes order on one clock. A row has a client-made id: a write repeated after a lost connection
is written once.

Besides work in slices, failures and workflows, handlers for Part III's promises: `model.fail_once`
(a retry after an expiry), `model.leak` (errors carrying secrets) and `model.huge` (a huge error).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import jobbus
from jobbus.worker import claimer

LOG_DDL = """
CREATE TABLE IF NOT EXISTS public.model_log (
    id        uuid PRIMARY KEY,
    kind      text NOT NULL,
    job_id    uuid,
    attempt   integer,
    lease     uuid,
    worker    text,
    pid       integer,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail    jsonb NOT NULL DEFAULT '{}'
)
"""
#: A row's detail also gets the database's start time of the job's current attempt (`claimed_at`, from
#: its claim): the rate check counts starts as the claims record them, not as a loaded machine's handlers
#: happen to begin a moment later; and the queue it was claimed from (a queued job may be moved to
#: another queue between its attempts, `App.update_many`).
INSERT = (
    "INSERT INTO public.model_log (id, kind, job_id, attempt, lease, worker, pid, detail)"
    " SELECT %(id)s::uuid, %(kind)s::text, %(job_id)s::uuid, %(attempt)s::int, %(lease)s::uuid,"
    " %(worker)s::text, %(pid)s::int,"
    " %(detail)s::jsonb || coalesce((SELECT jsonb_build_object('claimed_at', extract(epoch FROM j.started_at),"
    " 'queue', j.queue)"
    " FROM jobbus.job AS j WHERE j.id = %(job_id)s::uuid AND %(kind)s::text = 'start'), '{}')"
    " ON CONFLICT (id) DO NOTHING"
)
#: The log's connections carry this name: the fault injector never terminates them.
LOG_APPLICATION = "model_log"

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)
WORKER = os.environ.get("MODEL_WORKER_ID", "")


class _Log:
    """One connection per database per process for async handlers, one per database per thread for sync
    ones; reconnect and retry. With cells (SPEC 23) a row goes to the database of the job it is about
    (found once per job), a row about no job to every cell's."""

    def __init__(self) -> None:
        self._async: dict[str, psycopg.AsyncConnection[Any]] = {}
        self._lock: asyncio.Lock | None = None
        self._local = threading.local()
        self._cell_of: dict[uuid.UUID, str] = {}

    def _row(self, kind: str, job: Any, detail: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": uuid.uuid4(),
            "kind": kind,
            "job_id": job.id if job is not None else None,
            "attempt": job.attempt if job is not None else None,
            "lease": getattr(job, "lease_token", None),
            "worker": WORKER,
            "pid": os.getpid(),
            "detail": Jsonb(detail),
        }

    @staticmethod
    def _databases() -> list[str]:
        cells = app.cells
        return [cell.settings.dsn or "" for cell in cells.values()] if cells else [app.dsn]

    async def write(self, kind: str, job: Any, about: uuid.UUID | None = None, **detail: Any) -> None:
        row = self._row(kind, job, detail)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            job_id = job.id if job is not None else about
            for dsn in await self._where(job_id):
                await self._execute(dsn, INSERT, row)

    async def _where(self, job_id: uuid.UUID | None) -> list[str]:
        databases = self._databases()
        if len(databases) == 1 or job_id is None:
            return databases
        if job_id not in self._cell_of:
            for dsn in databases:
                if await self._execute(dsn, "SELECT 1 FROM jobbus.job WHERE id = %(id)s", {"id": job_id}):
                    self._cell_of[job_id] = dsn
                    break
            else:
                return databases[:1]  # deleted already: nothing of it is read from any cell
        return [self._cell_of[job_id]]

    async def _execute(self, dsn: str, query: str, params: dict[str, Any]) -> bool:
        """Run `query` on this process's connection to `dsn`; whether it returned a row."""
        for attempt in range(200):
            try:
                conn = self._async.get(dsn)
                if conn is None or conn.closed:
                    conn = self._async[dsn] = await psycopg.AsyncConnection.connect(
                        dsn, autocommit=True, application_name=LOG_APPLICATION, connect_timeout=5
                    )
                cursor = await conn.execute(query, params)
                return cursor.description is not None and await cursor.fetchone() is not None
            except psycopg.OperationalError:
                self._async.pop(dsn, None)
                await asyncio.sleep(min(0.05 * (attempt + 1), 1.0))
        raise RuntimeError(f"model log: could not run {query[:40]!r}")

    def write_sync(self, kind: str, job: Any, **detail: Any) -> None:
        row = self._row(kind, job, detail)
        databases = self._databases()
        if len(databases) > 1 and job is not None:
            if job.id not in self._cell_of:
                for dsn in databases:
                    if self._execute_sync(dsn, "SELECT 1 FROM jobbus.job WHERE id = %(id)s", {"id": job.id}):
                        self._cell_of[job.id] = dsn
                        break
            databases = [self._cell_of.get(job.id, databases[0])]
        for dsn in databases:
            self._execute_sync(dsn, INSERT, row)

    def _execute_sync(self, dsn: str, query: str, params: dict[str, Any]) -> bool:
        conns: dict[str, psycopg.Connection[Any]] = self._local.__dict__.setdefault("conns", {})
        for attempt in range(200):
            try:
                conn = conns.get(dsn)
                if conn is None or conn.closed:
                    conn = conns[dsn] = psycopg.connect(
                        dsn, autocommit=True, application_name=LOG_APPLICATION, connect_timeout=5
                    )
                cursor = conn.execute(query, params)
                return cursor.description is not None and cursor.fetchone() is not None
            except psycopg.OperationalError:
                conns.pop(dsn, None)
                time.sleep(min(0.05 * (attempt + 1), 1.0))
        raise RuntimeError(f"model log: could not run {query[:40]!r}")


log = _Log()
if WORKER:
    # The process has loaded its app: it claims shortly (a loaded machine can take seconds to get here).
    log.write_sync("ready", None)


async def _logged(job: jobbus.JobExecution, body: Any) -> Any:
    run = str(uuid.uuid4())
    await log.write("start", job, run=run, available_at=job.available_at.timestamp())
    job.logger.warning("model run %s", run)  # kept in this attempt's history entry only (SPEC 22)
    outcome = "raised"
    try:
        result = await body()
        outcome = "returned"
        return result
    except jobbus.JobParked:
        outcome = "parked"
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        await log.write("end", job, run=run, outcome=outcome)


async def effect(job: jobbus.JobExecution, step: str) -> str:
    await log.write("effect", job, step=step)
    await asyncio.sleep(float(job.configuration.get("step_sleep", 0)))
    return f"{step} by attempt {job.attempt}"


SLICE = 0.05


def _slices(job: Any) -> int:
    return round(float(job.configuration.get("sleep", 0)) / SLICE)


@app.job("model.work", max_attempts=50)
async def work(job: jobbus.JobExecution) -> Any:
    """Work for `sleep` seconds in small slices without looking at its flags: the worst case for a frozen
    worker, whose handler goes on with the slices left after SIGCONT."""

    async def body() -> Any:
        for _ in range(_slices(job)):
            await asyncio.sleep(SLICE)
        return {"pid": os.getpid()}

    return await _logged(job, body)


@app.job("model.work_sync", max_attempts=50)
def work_sync(job: jobbus.SyncJobExecution) -> Any:
    """The sync twin of model.work: a thread that cannot be interrupted."""
    run = str(uuid.uuid4())
    log.write_sync("start", job, run=run, available_at=job.available_at.timestamp())
    job.logger.warning("model run %s", run)
    outcome = "raised"
    try:
        for _ in range(_slices(job)):
            time.sleep(SLICE)
        outcome = "returned"
        return {"pid": os.getpid()}
    finally:
        log.write_sync("end", job, run=run, outcome=outcome)


#: The batch handlers' `batch_size` (2 to 5) and `batch_wait`, drawn by the run from its seed.
BATCH_SIZE = int(os.environ.get("MODEL_BATCH_SIZE", "3"))
BATCH_WAIT = float(os.environ.get("MODEL_BATCH_WAIT", "0.3"))
#: A batch claim of 4 jobs or more goes out in parts, as one of 2,000 does in production: the model's
#: small workers exercise parts in flight together, skipping each other's rows, under every fault.
claimer.CLAIM_PART_JOBS = 2


async def _batch_run(jobs: jobbus.JobBatch[jobbus.JobExecution]) -> list[Any]:
    """Each job's start is logged, the batch works in slices for its jobs' longest `sleep`, and a job told
    to stop (a lost lease, a cancellation, a shutdown, a timeout) leaves the work at once, its end logged:
    as a handler of one job returns or is cancelled, so no job is worked on after its attempt ended."""
    runs = {job.id: str(uuid.uuid4()) for job in jobs}
    call = str(uuid.uuid4())
    for job in jobs:
        await log.write(
            "start", job, run=runs[job.id], available_at=job.available_at.timestamp(), call=call, type=job.type
        )
        job.logger.warning("model run %s", runs[job.id])  # this job's alone, though the batch shares a call
    active = list(jobs)
    try:
        for _ in range(max(_slices(job) for job in jobs)):
            for job in [job for job in active if job.cancellation_requested]:
                active.remove(job)
                await log.write("end", job, run=runs[job.id], outcome="cancelled")
            await asyncio.sleep(SLICE)
    except asyncio.CancelledError:
        for job in active:
            await log.write("end", job, run=runs[job.id], outcome="cancelled")
        raise
    for job in active:
        await log.write("end", job, run=runs[job.id], outcome="returned")
    return [{"pid": os.getpid(), "batch": len(jobs)} for _ in jobs]


@app.job("model.batch", max_attempts=50, batch_size=BATCH_SIZE, batch_wait=BATCH_WAIT)
async def batch(jobs: jobbus.JobBatch[jobbus.JobExecution]) -> list[Any]:
    """A batch handler of model.work's jobs: up to `BATCH_SIZE` of them in one call."""
    return await _batch_run(jobs)


@app.job("model.batch_sync", max_attempts=50, batch_size=max(2, BATCH_SIZE - 1))
def batch_sync(jobs: jobbus.JobBatch[jobbus.SyncJobExecution]) -> list[Any]:
    """The sync twin of model.batch (no `batch_wait`): a thread that cannot be interrupted, which leaves
    a job's work once the job is told to stop."""
    runs = {job.id: str(uuid.uuid4()) for job in jobs}
    call = str(uuid.uuid4())
    for job in jobs:
        log.write_sync(
            "start", job, run=runs[job.id], available_at=job.available_at.timestamp(), call=call, type=job.type
        )
        job.logger.warning("model run %s", runs[job.id])  # this job's alone, though the batch shares a call
    active = list(jobs)
    for _ in range(max(_slices(job) for job in jobs)):
        for job in [job for job in active if job.cancellation_requested]:
            active.remove(job)
            log.write_sync("end", job, run=runs[job.id], outcome="cancelled")
        time.sleep(SLICE)
    for job in active:
        log.write_sync("end", job, run=runs[job.id], outcome="returned")
    return [{"pid": os.getpid(), "batch": len(jobs)} for _ in jobs]


@app.job("model.fail", max_attempts=1)
async def fail(job: jobbus.JobExecution) -> None:
    async def body() -> None:
        raise jobbus.NonRetryableError("a member that fails, as planned")

    await _logged(job, body)


@app.job("model.flow", max_attempts=50)
async def flow(job: jobbus.JobExecution) -> Any:
    """A workflow: step a, a durable sleep, an event (`event` key), children (`children` of them), step b."""
    config = job.configuration

    async def body() -> Any:
        first = await job.step("a", effect, job, "a")
        await job.sleep("nap", float(config.get("nap", 0.5)))
        payload = None
        if config.get("event"):
            payload = await job.wait_for_event(str(config["event"]), timeout=600)
            await log.write("received", job, key=str(config["event"]), payload=payload)
        kids = []
        for n in range(int(config.get("children", 0))):
            kids.append(
                await job.spawn(
                    "model.work", {"sleep": float(config.get("child_sleep", 0.1)), "child": n}, queue=job.queue
                )
            )
        if kids:
            done = await job.wait_for_children()
            if sorted(str(c.id) for c in done) != sorted(str(k) for k in kids):
                raise AssertionError(f"wait_for_children returned {[c.id for c in done]}, spawned {kids}")
        second = await job.step("b", effect, job, "b")
        return {"a": first, "b": second, "payload": payload}

    return await _logged(job, body)


@app.job("model.fail_once", max_attempts=50)
async def fail_once(job: jobbus.JobExecution) -> Any:
    """Work for `sleep` seconds, then fail the first attempt (a retryable error) and complete the next:
    with an `expires` shorter than `sleep`, the retry is claimed after the expiry (SPEC 18: it runs)."""

    async def body() -> Any:
        for _ in range(_slices(job)):
            await asyncio.sleep(SLICE)
        if job.attempt == 1:
            raise RuntimeError("the first attempt fails, as planned")
        return {"pid": os.getpid()}

    return await _logged(job, body)


def secret_text(secrets: list[list[str]]) -> str:
    """Each `[shape, value]` written the way code and libraries write that kind of secret."""
    shapes = {
        "token": "token={}",
        "api_key": "api_key={}",
        "client_secret": "client_secret={}",
        "bearer": "Authorization: Bearer {}",
        "password": 'password="{}"',
        "dsn": "postgresql://u:{}@h/db",
    }
    return "; ".join(shapes[shape].format(value) for shape, value in secrets)


@app.job("model.leak", max_attempts=2)
async def leak(job: jobbus.JobExecution) -> None:
    """Fail every attempt with an error that carries secrets (`secrets`: `[shape, value]` pairs), half of
    them in the message and half in the exception it was raised from (a chained traceback)."""
    secrets = [list(s) for s in job.configuration["secrets"]]

    async def body() -> None:
        outer, inner = secrets[::2], secrets[1::2]
        try:
            raise ValueError(f"while signing in: {secret_text(inner)}" if inner else "while signing in")
        except ValueError as exc:
            raise RuntimeError(f"upstream refused the call: {secret_text(outer)}") from exc

    await _logged(job, body)


def huge_text(variant: str, marker: str | None) -> str:
    """An error message of at least 300 KiB: `url` is a run of URL-like text that a backtracking
    pattern takes quadratic time over; `json` is compact JSON of URLs with a password (`marker`)."""
    if variant == "url":
        return "a://b:" * 60000
    items = [
        {"id": n, "dsn": f"postgresql://u:{marker}@h/db", "next": f"https://example.invalid/p/{n}?from=a://b:"}
        for n in range(3000)
    ]
    return json.dumps(items, separators=(",", ":"))


@app.job("model.huge", max_attempts=1)
async def huge(job: jobbus.JobExecution) -> None:
    """Fail with a huge error message (`variant`, see `huge_text`)."""
    text = huge_text(str(job.configuration["variant"]), job.configuration.get("marker"))

    async def body() -> None:
        raise RuntimeError(text)

    await _logged(job, body)


@app.on(jobbus.JobCompleted)
async def completed(event: jobbus.JobCompleted) -> None:
    await log.write("completed", None, about=event.job_id, completed=str(event.job_id), attempt=event.attempt)
