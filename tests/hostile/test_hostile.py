"""The worker attacked from inside: hostile handlers and payloads, each in real worker processes beside
innocent jobs.

For every case: the hostile job ends in a defined state with a clear `last_error`; every innocent job
completes exactly once; nothing stays `running` past its lease; the workers stay up and stop with
exit 0 when asked.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus.redaction import MASK
from tests.hostile.apps import DDL
from tests.processes import finish, query, start_worker, wait_until

APP = "tests.hostile.apps:app"
LEASE = 2.0
ENV = {
    "JOBBUS_LEASE_SECONDS": str(LEASE),
    "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "3",
}
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def db(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL.encode())
    return dsn


@dataclass(frozen=True)
class Case:
    name: str
    type: str
    configuration: dict[str, Any] = field(default_factory=dict)
    status: str = "failed"
    attempts: int | None = None
    error: str | None = None
    #: Raw JSON stored by "another producer", bypassing the library's checks.
    stored: str | None = None
    #: Something more to check about the job, the runs and the workers' output.
    check: Callable[[str, uuid.UUID, str], None] | None = None
    #: Something to wait for while the workers still run.
    settle: Callable[[str, uuid.UUID], None] | None = None


def _leak_refused(dsn: str, job_id: uuid.UUID) -> None:
    leaks = wait_until(lambda: query(dsn, "SELECT what FROM public.leaks WHERE job_id = %s", (job_id,)), 10)
    assert len(leaks) == 1 and leaks[0][0].startswith("refused:") and "is over" in leaks[0][0], leaks


def _watchdog_named(seconds: float) -> Callable[[str, uuid.UUID, str], None]:
    def check(dsn: str, job_id: uuid.UUID, output: str) -> None:
        assert "the event loop is blocked" in output and str(job_id) in output and "block_loop" in output, output
        runs = query(dsn, "SELECT attempt, started FROM public.runs WHERE job_id = %s ORDER BY started", (job_id,))
        if seconds > LEASE:
            # Its lease ran out while it blocked: it ran again elsewhere, but never under a valid lease.
            assert [a for a, _ in runs] == [1, 2]
            assert (runs[1][1] - runs[0][1]).total_seconds() >= LEASE - 0.3
        else:
            assert [a for a, _ in runs] == [1]

    return check


CASES = [
    *(
        Case(f"raises {kind}", "raise", {"kind": kind}, attempts=2, error=kind)
        for kind in ("CancelledError", "KeyboardInterrupt", "SystemExit", "GeneratorExit", "Custom")
    ),
    *(
        Case(f"sync raises {kind}", "raise_sync", {"kind": kind}, attempts=2, error=kind)
        for kind in ("KeyboardInterrupt", "SystemExit", "GeneratorExit")
    ),
    Case("returns a lone surrogate", "return", {"kind": "surrogate"}, attempts=1, error="surrogate"),
    Case("returns NaN", "return", {"kind": "nan"}, attempts=1, error="NaN"),
    Case("returns -Infinity", "return", {"kind": "infinity"}, attempts=1, error="Infinity"),
    Case("returns 3 MB", "return", {"kind": "huge"}, attempts=1, error="max_payload_bytes"),
    Case("returns an object", "return", {"kind": "object"}, attempts=1, error="not JSON serialisable"),
    Case("returns a circular list", "return", {"kind": "circular"}, attempts=1, error="return value"),
    Case("returns integer keys", "return", {"kind": "int-keys"}, status="completed"),
    Case(
        "blocks the loop past a heartbeat",
        "block_loop",
        {"seconds": 1.2},
        status="completed",
        attempts=1,
        check=_watchdog_named(1.2),
    ),
    Case(
        "blocks the loop past its lease",
        "block_loop",
        {"seconds": 3.0},
        status="completed",
        attempts=2,
        check=_watchdog_named(3.0),
    ),
    Case("leaves a task writing after it", "leak_task", status="completed", attempts=1, settle=_leak_refused),
    Case("leaves a thread writing after it", "leak_thread", status="completed", attempts=1, settle=_leak_refused),
    Case("holds a pool connection in its scope", "innocent", {"hold_pool": True, "sleep": 1}, status="completed"),
    Case(
        "configuration nested 3,000 levels",
        "innocent",
        stored=json.dumps({"tree": 0}).replace("0", "[" * 3000 + "]" * 3000),
        attempts=1,
        error="nested too deeply",
    ),
    Case(
        "configuration of 2 MB",
        "innocent",
        stored=json.dumps({"blob": [uuid.uuid4().hex for _ in range(60_000)]}),
        attempts=1,
        error="max_payload_bytes",
    ),
    Case(
        "configuration of 8 MB that compresses to a few KB",
        "innocent",
        stored=json.dumps({"blob": ["the same words again"] * 400_000}),
        attempts=1,
        error="max_payload_bytes",
    ),
]


def _schedule_hostile(dsn: str, app: jobbus.App, case: Case) -> uuid.UUID:
    if case.stored is None:
        return app.sync.schedule(case.type, case.configuration, max_attempts=2)
    job_id = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, configuration_data) VALUES (%s, %s, 2, %s::jsonb)",
            (job_id, case.type, case.stored),
        )
    return job_id


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_job_ends_defined_and_its_innocent_neighbours_complete_once(db: str, case: Case) -> None:
    app = jobbus.App(dsn=db)
    hostile = _schedule_hostile(db, app, case)
    procs = [start_worker(db, "--concurrency", "3", env=ENV, app=APP) for _ in range(2)]
    try:
        wait_until(lambda: _status(db, hostile) != "queued", what="the hostile job to be claimed")
        # Both workers up before the innocents come: the attack meets two workers, and both exit on SIGTERM.
        wait_until(lambda: query(db, "SELECT count(*) FROM jobbus.worker")[0][0] == 2, what="both workers")
        # Scheduled once the hostile job runs: what runs beside it (and what its worker holds then) is
        # what the attack must not harm.
        innocents = app.sync.schedule_many("innocent", [{"sleep": 0.2} for _ in range(8)])
        app.sync.close()
        wait_until(lambda: _status(db, hostile) in TERMINAL, timeout=45, what=f"the hostile job to end ({case.name})")
        wait_until(lambda: all(_status(db, i) == "completed" for i in innocents), timeout=30, what="innocents")
        assert not query(
            db,
            "SELECT id FROM jobbus.job WHERE status = 'running' AND lease_expires_at < now() - interval '1 second'",
        ), "a job stayed running past its lease"
        assert all(p.poll() is None for p in procs), "a worker died"
        if case.settle is not None:
            case.settle(db, hostile)
        # Both registered, so both handle SIGTERM: under load one may still be starting when the other
        # has done every job, and a SIGTERM before its handlers are set ends it outright (-15).
        wait_until(lambda: query(db, "SELECT count(*) FROM jobbus.worker")[0][0] == 2, what="both workers registered")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        results = [finish(p, timeout=30) for p in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [code for code, _ in results] == [0, 0], [out[-3000:] for _, out in results]
    output = "\n".join(out for _, out in results)
    status, attempts, last_error = query(
        db, "SELECT status, attempts, last_error FROM jobbus.job WHERE id = %s", (hostile,)
    )[0]
    assert status == case.status, (last_error, output[-3000:])
    if case.attempts is not None:
        assert attempts == case.attempts, last_error
    if case.error is not None:
        assert last_error is not None and case.error in last_error, last_error
    runs = query(db, "SELECT job_id, count(*) FROM public.runs WHERE job_id = ANY(%s) GROUP BY job_id", (innocents,))
    assert sorted(n for _, n in runs) == [1] * len(innocents), "an innocent job ran twice or never"
    if case.check is not None:
        case.check(db, hostile, output)


def test_a_handler_that_ignores_every_cancellation_keeps_its_lease_until_its_process_is_gone(db: str) -> None:
    app = jobbus.App(dsn=db)
    job_id = app.sync.schedule("stubborn", {"seconds": 60})
    innocent = app.sync.schedule("innocent")
    app.sync.close()
    worker = start_worker(db, "--shutdown-timeout", "0.3", "--worker-id", "stubborn-host", env=ENV, app=APP)
    try:
        wait_until(lambda: query(db, "SELECT 1 FROM public.runs WHERE job_id = %s", (job_id,)), what="it to start")
        wait_until(lambda: _status(db, innocent) == "completed", what="the innocent job")
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code, out = finish(worker, timeout=30)
        took = time.monotonic() - started
    finally:
        worker.kill()
    assert code == 0, out
    assert took < 20, f"the worker took {took:.1f} s to exit"
    assert "did not end" in out
    # One account of the job, not two that contradict each other.
    assert f"job {job_id} did not end" in out and f"job {job_id}: released at shutdown" not in out
    # Never released while it ran: the job waits for the process to be gone, then runs again.
    assert _status(db, job_id) == "running"
    successor = start_worker(db, "--worker-id", "stubborn-host", env=ENV, app=APP)
    try:
        wait_until(lambda: len(query(db, "SELECT 1 FROM public.runs WHERE job_id = %s", (job_id,))) == 2, 30)
    finally:
        successor.kill()
        successor.wait()


def test_a_producer_transaction_held_open_on_a_running_jobs_key_blocks_nothing(db: str) -> None:
    app = jobbus.App(dsn=db)
    job_id = app.sync.schedule("innocent", {"sleep": 2}, unique_key="order:7")
    worker = start_worker(db, env=ENV, app=APP)
    try:
        wait_until(lambda: _status(db, job_id) == "running", what="the job to start")
        with psycopg.connect(db) as producer:
            assert app.sync.schedule("innocent", unique_key="order:7", connection=producer) == job_id
            # Open for longer than the lease: renewals and the outcome must not wait for it.
            wait_until(lambda: _status(db, job_id) == "completed", timeout=10, what="completion")
            producer.commit()
        assert app.sync.schedule("innocent", unique_key="order:7", available_at=timedelta(hours=1)) != job_id
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    finally:
        worker.kill()
        app.sync.close()
    assert code == 0, out
    assert query(db, "SELECT count(*) FROM public.runs WHERE job_id = %s", (job_id,))[0][0] == 1


@pytest.mark.parametrize("size", [300 * 1024, 10 * 1024 * 1024], ids=["300 KiB", "10 MiB"])
def test_a_handler_raising_a_huge_message_again_and_again_costs_no_other_job_its_lease(db: str, size: int) -> None:
    """Before, masking one such traceback held the event loop for minutes: the leases of the worker's
    other jobs lapsed and they ran a second time elsewhere while their first run went on."""
    app = jobbus.App(dsn=db)
    long_job = app.sync.schedule("innocent", {"sleep": 4 * LEASE})  # four leases long, renewed as usual
    worker = start_worker(db, "--concurrency", "4", env=ENV, app=APP)
    try:
        wait_until(lambda: _status(db, long_job) == "running", what="the long job to start")
        hostile = app.sync.schedule("raise_huge", {"size": size}, max_attempts=5)
        app.sync.close()
        wait_until(lambda: _status(db, hostile) in TERMINAL, timeout=60, what="the huge errors to end their job")
        wait_until(lambda: _status(db, long_job) in TERMINAL, timeout=60, what="the long job to end")
        worker.send_signal(signal.SIGTERM)
        code, output = finish(worker, timeout=30)
    finally:
        worker.kill()
    assert code == 0, output[-3000:]
    assert _status(db, long_job) == "completed"
    assert query(db, "SELECT count(*) FROM public.runs WHERE job_id = %s", (long_job,))[0][0] == 1
    for trouble in ("lease lost", "lease expired", "was not started", "the event loop is blocked"):
        assert trouble not in output, output[-3000:]
    status, attempts, last_error, group, history = query(
        db, "SELECT status, attempts, last_error, error_group, history FROM jobbus.job WHERE id = %s", (hostile,)
    )[0]
    assert (status, attempts, len(history)) == ("failed", 5, 5)
    assert len(last_error.encode()) <= 4096 and last_error.startswith(f"ValueError: api_key={MASK} a://b:")
    for entry in history:
        assert len(entry["error"].encode()) <= 4096 and len(entry["traceback"].encode()) <= 16 * 1024
        assert entry["traceback"].rstrip().endswith(f"postgresql://app:{MASK}@db/app client_secret={MASK}")
    stored = [last_error, group, *(e["error"] for e in history), *(e["traceback"] for e in history)]
    for secret in ("SVstart", "SVmiddle", "SVdsn", "SVend"):
        assert secret not in "".join(stored) and secret not in output, secret
    assert max(map(len, output.splitlines())) < 32 * 1024  # each log line bounded, whatever the message


def _status(dsn: str, job_id: uuid.UUID) -> str | None:
    rows = query(dsn, "SELECT status FROM jobbus.job WHERE id = %s", (job_id,))
    return str(rows[0][0]) if rows else None
