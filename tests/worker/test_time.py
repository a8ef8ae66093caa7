"""Periodic jobs across real worker processes and a killed leader; timeouts, snooze and per-handler
backoff in real worker processes."""

from __future__ import annotations

import itertools
import signal
import time
import uuid
from datetime import timedelta

import pytest

import jobbus
from tests.processes import executions, finish, prepare, query, start_worker, status_of, wait_until

APP = "tests.time_apps:app"
QUICK = {"JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5", "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "3"}


@pytest.fixture
def db(dsn: str) -> str:
    prepare(dsn)
    return dsn


def _leader(dsn: str) -> str | None:
    rows = query(dsn, "SELECT worker_id FROM jobbus.leader WHERE expires_at > now()")
    return str(rows[0][0]) if rows else None


def test_eight_workers_and_a_killed_leader_enqueue_every_tick_exactly_once(db: str) -> None:
    serve_default = ("--queue", "default")
    procs = {f"w{n}": start_worker(db, "--worker-id", f"w{n}", *serve_default, env=QUICK, app=APP) for n in range(8)}
    try:
        wait_until(lambda: len(query(db, "SELECT 1 FROM jobbus.job WHERE name = 'every-second'")) >= 3, 30)
        leader = wait_until(lambda: _leader(db), what="a leader")
        procs[leader].kill()
        procs[leader].wait()
        wait_until(lambda: _leader(db) not in (None, leader), timeout=20, what="a new leader")
        time.sleep(3)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            finish(proc)
    finally:
        for proc in procs.values():
            proc.kill()
    ticks = [row[0] for row in query(db, "SELECT available_at FROM jobbus.job WHERE name = 'every-second' ORDER BY 1")]
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks)), f"a gap: {ticks}"
    assert len(ticks) >= 6


def test_an_async_handler_is_cancelled_at_its_timeout_and_retried(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("slow_async", max_attempts=3)
    worker = start_worker(db, "--stop-when-empty", app=APP)
    code, out = finish(worker, timeout=60)
    assert code == 0, out
    job = sync_app.sync.find(job_id)
    assert job is not None and (job.status, job.attempts, job.result) == ("completed", 2, "in time")
    assert job.last_error == "timed out after 0.5 s"
    assert [h["outcome"] for h in job.history] == ["timed_out", "completed"]


def test_a_sync_handler_past_its_timeout_is_reported_and_then_recorded_as_timed_out(
    db: str, sync_app: jobbus.App
) -> None:
    job_id = sync_app.sync.schedule("slow_sync", max_attempts=3)
    worker = start_worker(db, "--stop-when-empty", app=APP)
    code, out = finish(worker, timeout=60)
    assert code == 0, out
    assert "overrunning its timeout of 0.5 s" in out
    job = sync_app.sync.find(job_id)
    assert job is not None and (job.status, job.attempts) == ("completed", 2)
    assert job.last_error == "timed out after 0.5 s"
    # the thread kept its lease until it returned: the job never ran twice at once
    runs = query(db, "SELECT attempt, at FROM public.executions WHERE job_id = %s ORDER BY at", (job_id,))
    assert [a for a, _ in runs] == [1, 2] and (runs[1][1] - runs[0][1]).total_seconds() >= 1.4


def _run_until_done(db: str, job_id: uuid.UUID) -> tuple[int, str]:
    """A worker (not --stop-when-empty: a snoozed or retried job waits for its time) until the job ends."""
    worker = start_worker(db, app=APP)
    try:
        wait_until(lambda: status_of(db, job_id) in ("completed", "failed"), timeout=30, what="the job to end")
        worker.send_signal(signal.SIGTERM)
        return finish(worker)
    finally:
        worker.kill()


def test_a_snooze_is_not_an_attempt_and_keeps_the_checkpoint(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("not_yet", max_attempts=1)  # two snoozes with a single attempt allowed
    code, out = _run_until_done(db, job_id)
    assert code == 0, out
    job = sync_app.sync.find(job_id)
    assert job is not None and (job.status, job.result) == ("completed", "ready after 2 snoozes")
    assert job.attempts == 1 and job.execution_data == {"seen": 2}
    assert [h["outcome"] for h in job.history] == ["snoozed", "snoozed", "completed"]
    assert [h["delay_seconds"] for h in job.history[:2]] == [0.2, 0.2]
    assert len(executions(db, job_id)) == 3


def test_a_handlers_own_backoff_replaces_the_settings_formula(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("flaky_backoff")
    code, out = _run_until_done(db, job_id)
    assert code == 0, out
    job = sync_app.sync.find(job_id)
    assert job is not None and (job.status, job.attempts) == ("completed", 3)
    assert [h.get("delay_seconds") for h in job.history] == [0.4, 0.8, None]
    runs = query(db, "SELECT at FROM public.executions WHERE job_id = %s ORDER BY at", (job_id,))
    gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(runs)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.8, gaps
