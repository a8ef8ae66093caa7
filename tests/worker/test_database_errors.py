"""Each class of database error, injected with jobs in flight: the worker rides out the transient ones
and, on a fatal one, gives back what it holds and exits 70 within a bounded time."""

from __future__ import annotations

import signal
import time
import uuid

import psycopg
import pytest
from psycopg import sql

import jobbus
from tests.processes import finish, prepare, query, start_worker, status_of, wait_until

FAULTS = """
CREATE TABLE public.fault (sqlstate text NOT NULL, phase text NOT NULL);
CREATE FUNCTION public.inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    f record;
BEGIN
    SELECT * INTO f FROM public.fault LIMIT 1;
    IF f IS NULL THEN
        RETURN NEW;
    END IF;
    IF f.phase = 'any'
       OR (f.phase = 'claim' AND OLD.status = 'queued' AND NEW.status = 'running')
       OR (f.phase = 'outcome' AND OLD.status = 'running' AND NEW.status <> 'running') THEN
        RAISE EXCEPTION 'injected fault %', f.sqlstate USING ERRCODE = f.sqlstate;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER inject_fault BEFORE UPDATE ON jobbus.job FOR EACH ROW EXECUTE FUNCTION public.inject_fault();
"""
FAST_WORKER = {
    "JOBBUS_LEASE_SECONDS": "20",
    "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.3",
    "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "5",
}


@pytest.fixture
def db(dsn: str) -> str:
    prepare(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FAULTS.encode())
    return dsn


def inject(dsn: str, sqlstate: str | None, phase: str = "any") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM public.fault")
        if sqlstate is not None:
            conn.execute("INSERT INTO public.fault VALUES (%s, %s)", (sqlstate, phase))


def running(dsn: str, ids: list[uuid.UUID]) -> int:
    return int(query(dsn, "SELECT count(*) FROM jobbus.job WHERE id = ANY(%s) AND status = 'running'", (ids,))[0][0])


TRANSIENT = {
    "25006": "read-only transaction (a demoted primary)",
    "57P01": "admin shutdown",
    "53300": "too many connections",
    "40001": "serialization failure",
    "40P01": "deadlock",
    "57014": "statement timeout",
    "55P03": "lock timeout",
}


def test_transient_errors_are_ridden_out_with_jobs_in_flight(db: str, sync_app: jobbus.App) -> None:
    ids = sync_app.sync.schedule_many("record", [{"sleep": 0.4} for _ in range(24)])
    worker = start_worker(db, "--concurrency", "3", env=FAST_WORKER)
    try:
        for sqlstate in TRANSIENT:
            wait_until(lambda: running(db, ids) > 0 or status_of(db, ids[-1]) == "completed", what="jobs in flight")
            inject(db, sqlstate)
            time.sleep(1.2)
            inject(db, None)
            assert worker.poll() is None, f"the worker died of {sqlstate} ({TRANSIENT[sqlstate]})"
        wait_until(lambda: all(status_of(db, i) == "completed" for i in ids), timeout=60, what="every job done")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    finally:
        worker.kill()
    assert code == 0, out
    assert "hit a transient database error" in out


def test_a_read_only_database_for_seconds_is_ridden_out_and_no_worker_is_left_hanging(
    db: str, sync_app: jobbus.App
) -> None:
    """What a demoted primary or a failover behind stale DNS looks like: every new session is read-only."""
    ids = sync_app.sync.schedule_many("record", [{"sleep": 1} for _ in range(6)])
    name = query(db, "SELECT current_database()")[0][0]

    def read_only(on: bool) -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")
            setting = sql.SQL("SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only")
            conn.execute(sql.SQL("ALTER DATABASE {} ").format(sql.Identifier(name)) + setting)
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )

    worker = start_worker(db, "--concurrency", "3", env=FAST_WORKER)
    try:
        wait_until(lambda: running(db, ids) == 3, what="three jobs in flight")
        read_only(True)
        time.sleep(6)
        assert worker.poll() is None, "the worker gave up during the read-only spell"
        read_only(False)
        wait_until(lambda: all(status_of(db, i) == "completed" for i in ids), timeout=60, what="every job done")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker, timeout=30)
    finally:
        read_only(False)
        worker.kill()
    assert code == 0, out


@pytest.mark.parametrize("sqlstate", ["42501", "42P01", "XX000"], ids=["privilege", "undefined-table", "internal"])
def test_a_fatal_error_in_the_claim_gives_back_what_the_worker_holds_and_exits_70(
    db: str, sync_app: jobbus.App, sqlstate: str
) -> None:
    held = sync_app.sync.schedule_many("stubborn", [{"sleep": 60}, {"sleep": 60}])
    worker = start_worker(db, "--concurrency", "4", env=FAST_WORKER)
    try:
        wait_until(lambda: running(db, held) == 2, what="two jobs in flight")
        inject(db, sqlstate, "claim")
        started = time.monotonic()
        sync_app.sync.schedule("record")  # the next claim meets the fault
        code, out = finish(worker, timeout=30)
        took = time.monotonic() - started
    finally:
        worker.kill()
        inject(db, None)
    assert code == 70, out
    assert took < 20, f"exit took {took:.1f} s"
    assert "non-transient database error" in out and "injected fault" in out
    for job_id in held:  # given back at once, the attempt not counted
        job = sync_app.sync.find(job_id)
        assert job is not None and (job.status, job.attempts) == (jobbus.JobStatus.QUEUED, 0)


def test_a_fatal_error_writing_outcomes_still_exits_70_within_a_bounded_time(db: str, sync_app: jobbus.App) -> None:
    job_ids = sync_app.sync.schedule_many("record", [{"sleep": 1}, {"sleep": 1}])
    worker = start_worker(db, "--concurrency", "2", env=FAST_WORKER)
    try:
        wait_until(lambda: running(db, job_ids) == 2, what="two jobs in flight")
        inject(db, "42501", "outcome")
        started = time.monotonic()
        code, out = finish(worker, timeout=40)
        took = time.monotonic() - started
    finally:
        worker.kill()
        inject(db, None)
    assert code == 70, out
    assert took < 25, f"exit took {took:.1f} s"
    # Nothing could be written: the jobs keep their leases and are recovered once those expire.
    assert {status_of(db, i) for i in job_ids} == {"running"}
