"""Driving the job store directly, as a worker would, for store-level tests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from jobbus import App
from jobbus.models import ClaimedJob, JobStatus
from jobbus.store import Claim, MaintenanceStore, Outcome, Registration, Statement, run_sync

T = TypeVar("T")


def claim(
    app: App,
    conn: psycopg.Connection[Any],
    limit: int = 1,
    *,
    types: Sequence[str] = ("t",),
    queues: Sequence[str] | None = None,
    worker_id: str = "w1",
    lease_seconds: float = 60,
) -> list[ClaimedJob]:
    return run_sync(
        conn,
        claim_statement(app, conn, limit, types=types, queues=queues, worker_id=worker_id, lease_seconds=lease_seconds),
    ).jobs


def claim_statement(
    app: App,
    conn: psycopg.Connection[Any],
    limit: int,
    *,
    types: Sequence[str] = ("t",),
    queues: Sequence[str] | None = None,
    worker_id: str = "w1",
    lease_seconds: float = 60,
) -> Statement[Claim]:
    """The claim a worker with these handler types and queues sends now (its pairs read from the table)."""
    pairs = [
        (queue, job_type)
        for queue, job_type in run_sync(conn, MaintenanceStore(app.settings.schema).queued_pairs())
        if job_type in types and (queues is None or queue in queues)
    ]
    limited: list[str] = run_sync(conn, app.queue_store.limited_queues())
    return app.store.claim_jobs(
        worker_id=worker_id,
        limit=limit,
        pairs=pairs,
        lease_seconds=lease_seconds,
        max_payload_bytes=app.settings.max_payload_bytes,
        limited_queues=limited,
    )


def expire_lease(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> None:
    """Move the lease into the past, as if the holder stopped heartbeating long ago."""
    conn.execute("UPDATE jobbus.job SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (job_id,))


def write(app: App, conn: psycopg.Connection[Any], job: ClaimedJob, status: JobStatus, **kwargs: Any) -> bool:
    applied = run_sync(conn, app.store.record_outcomes([Outcome(job.id, job.lease_token, status, **kwargs)]))
    return job.id in applied


def registration(worker_id: str, instance_id: uuid.UUID) -> Registration:
    """A worker of type "t" that is declared dead after 3 s of silence."""
    return Registration(
        worker_id=worker_id,
        instance_id=instance_id,
        host="h",
        pid=1,
        queues=None,
        types=["t"],
        concurrency=2,
        lease_seconds=300.0,
        dead_after_seconds=3.0,
        heartbeat_seconds=1.0,
        pool_size=25,
    )


def behind_a_lock(
    dsn: str,
    holder: psycopg.Connection[Any],
    waiter: psycopg.Connection[Any],
    statement: Statement[T],
    meanwhile: Callable[[], object] = lambda: None,
) -> T:
    """Two leaders running one statement at once, the second held up by the first: `statement` runs on
    `waiter` while `holder`'s transaction is still open and must wait for a lock of it; then `meanwhile()`
    runs, `holder` commits, and `waiter`'s result comes back, committed."""
    results: list[T] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            results.append(run_sync(waiter, statement))
            waiter.commit()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        _until_waiting_for_a_lock(dsn, waiter.info.backend_pid)
        meanwhile()
    finally:
        holder.commit()
        thread.join(10.0)
    if failures:
        raise failures[0]
    return results[0]


def _until_waiting_for_a_lock(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(100):
            row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row == ("Lock",):
                return
            time.sleep(0.1)
    raise AssertionError(f"backend {pid} never waited for a lock")
