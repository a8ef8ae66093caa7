"""Real worker processes, real signals: exactly-once under concurrency, crashes, stops and fencing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import jobbus
from tests.processes import executions, finish, prepare, query, start_worker, status_of, wait_until, workers

SHORT_LEASE = {"JOBBUS_LEASE_SECONDS": "2", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}


@pytest.fixture
def db(dsn: str) -> str:
    prepare(dsn)
    return dsn


@pytest.mark.smoke
def test_three_workers_run_300_jobs_each_exactly_once_and_exit_0_when_empty(db: str, sync_app: jobbus.App) -> None:
    ids = sync_app.sync.schedule_many("record", [{"n": n} for n in range(300)])
    with workers(db, 3, "--concurrency", "5", "--stop-when-empty") as procs:
        results = [finish(p) for p in procs]
    assert [code for code, _ in results] == [0, 0, 0], [out[-2000:] for _, out in results]
    statuses = Counter(status for (status,) in query(db, "SELECT status FROM jobbus.job"))
    assert statuses == Counter({"completed": 300})
    runs = Counter(job_id for job_id, _, _ in executions(db))
    assert set(runs) == set(ids)
    assert set(runs.values()) == {1}


def _take_over(db: str, job_id: uuid.UUID) -> tuple[int, int, str]:
    """A second worker that runs until the job is completed, then stops: (its pid, exit code, output)."""
    worker = start_worker(db, env=SHORT_LEASE)
    try:
        wait_until(lambda: status_of(db, job_id) == "completed", timeout=30, what="the job to complete")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    finally:
        worker.kill()
    return worker.pid, code, out


def test_killed_worker_job_is_completed_by_another_after_lease_expiry(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 60, "first_only": True})
    with workers(db, 1, env=SHORT_LEASE) as (first,):
        wait_until(lambda: executions(db, job_id), what="the first attempt to start")
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert status_of(db, job_id) == "running"  # left behind with a lease that will expire
        second_pid, code, out = _take_over(db, job_id)
    assert code == 0, out
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert (job.status, job.attempts) == (jobbus.JobStatus.COMPLETED, 2)
    assert job.result == {"pid": second_pid, "attempt": 2}
    assert [attempt for _, attempt, _ in executions(db, job_id)] == [1, 2]


def test_stopped_worker_past_its_lease_cannot_overwrite_the_new_attempt(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 3, "first_only": True})
    with workers(db, 1, env=SHORT_LEASE) as (stale,):
        wait_until(lambda: executions(db, job_id), what="the first attempt to start")
        stale.send_signal(signal.SIGSTOP)
        fresh_pid, code, _ = _take_over(db, job_id)
        assert code == 0
        stale.send_signal(signal.SIGCONT)
        time.sleep(4)  # the stale handler finishes its sleep and tries to complete
        assert stale.poll() is None, "the stale worker must keep running"
        stale.send_signal(signal.SIGTERM)
        code, out = finish(stale)
    assert code == 0
    assert "lease" in out
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert (job.status, job.attempts, job.result) == (jobbus.JobStatus.COMPLETED, 2, {"pid": fresh_pid, "attempt": 2})


def test_a_resumed_worker_stops_its_expired_handlers_before_they_go_on(
    db: str, sync_app: jobbus.App, tmp_path: Path
) -> None:
    """Frozen (SIGSTOP) past its leases, a worker's handlers would resume beside their re-runs: their
    side effects are not fenced. At SIGCONT the worker tells them at once; an async handler that
    ignores it is cancelled without grace, a sync one that polls `cancellation_requested` stops.
    The window that remains (side effects after SIGCONT) is counted, and printed for the docs."""
    path = tmp_path / "ticks"
    path.touch()
    env = {**SHORT_LEASE, "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "3"}
    ids = {
        "async": sync_app.sync.schedule("ticker", {"path": str(path)}),
        "sync": sync_app.sync.schedule("ticker_sync", {"path": str(path)}),
    }
    with workers(db, 1, "--concurrency", "2", env=env) as (frozen,):
        wait_until(lambda: len(_ticks(path, frozen.pid)) == 2, what="both handlers to tick")
        frozen.send_signal(signal.SIGSTOP)
        time.sleep(4)  # past the 2 s leases and the 2 s fence
        resumed_at = time.time()
        frozen.send_signal(signal.SIGCONT)
        time.sleep(3)
        ticks = _ticks(path, frozen.pid)
        frozen.send_signal(signal.SIGTERM)
        code, out = finish(frozen)
    assert code == 0, out
    after = {kind: [t for t in ticks.get(job_id, []) if t > resumed_at] for kind, job_id in ids.items()}
    windows = {kind: max(times) - resumed_at if times else 0.0 for kind, times in after.items()}
    print(f"RESUME WINDOW ticks after SIGCONT: { {k: len(v) for k, v in after.items()} }, seconds: {windows}")
    # Each handler ticks every 50 ms; with the old half-second grace the async one ticked ~10 times.
    assert len(after["async"]) <= 2, after
    assert len(after["sync"]) <= 3, after


def _ticks(path: Path, pid: int) -> dict[uuid.UUID, list[float]]:
    """Wall-clock times of first-attempt side effects of process `pid`, per job."""
    ticks: dict[uuid.UUID, list[float]] = {}
    for line in path.read_text().splitlines():
        job_id, attempt, by, at = line.split()
        if int(attempt) == 1 and int(by) == pid:
            ticks.setdefault(uuid.UUID(job_id), []).append(float(at))
    return ticks


@pytest.mark.smoke
def test_sigterm_lets_the_running_job_finish_then_exits_0(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 1.5})
    with workers(db, 1) as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out
    assert status_of(db, job_id) == "completed"


def test_sigterm_with_a_short_timeout_releases_a_long_job_and_exits_promptly(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("stubborn", {"sleep": 120})
    with workers(db, 1, "--shutdown-timeout", "0.5") as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker, timeout=20)
    assert code == 0, out
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert job.status is jobbus.JobStatus.QUEUED  # released: available again at once, not failed
    assert f"job {job_id}: released at shutdown" in out and "did not end" not in out
    assert job.attempts == 0
    assert job.lease_token is None
    assert job.available_at <= query(db, "SELECT now()")[0][0]


def test_a_thread_that_outlives_the_shutdown_keeps_its_lease_until_the_process_is_gone(
    db: str, sync_app: jobbus.App
) -> None:
    """A sync handler's thread cannot be interrupted: its job is never released while it still runs.
    The process exits with the lease held; a successor takes the job back once the process is gone."""
    job_id = sync_app.sync.schedule("stubborn_sync", {"sleep": 120})
    with workers(db, 1, "--shutdown-timeout", "0.5", "--worker-id", "pod-s") as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker, timeout=20)
    assert code == 0, out
    assert "in threads" in out
    assert f"job {job_id} did not end" in out and f"job {job_id}: released at shutdown" not in out
    job = sync_app.sync.find(job_id)
    assert job is not None and job.status is jobbus.JobStatus.RUNNING and job.lease_token is not None
    state = query(db, "SELECT state FROM jobbus.worker WHERE id = 'pod-s'")[0][0]
    assert state != "stopped"  # so it is treated as silent, not as a clean stop
    successor = start_worker(db, "--worker-id", "pod-s", "--stop-when-empty")
    try:
        wait_until(lambda: len(executions(db, job_id)) == 2, timeout=30, what="the successor to run the job")
    finally:
        successor.kill()
        successor.wait()


def test_second_sigterm_skips_the_wait(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("stubborn", {"sleep": 120})
    with workers(db, 1, "--shutdown-timeout", "100") as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker, timeout=20)
    assert code == 0, out
    assert status_of(db, job_id) == "queued"


def test_sigterm_while_the_worker_starts_up_stops_it_cleanly(db: str, sync_app: jobbus.App, tmp_path: Path) -> None:
    """A worker still loading its application (or connecting) when a supervisor stops it: the signal is
    kept until the worker can act on it, then it stops as a running worker does, exit 0, no job taken."""
    job_id = sync_app.sync.schedule("record", {})
    gate = tmp_path / "gate"
    worker = start_worker(db, env={"JOBBUS_TEST_IMPORT_GATE": str(gate)}, app="tests.gated_import_app:app")
    try:
        assert worker.stdout is not None and "importing" in worker.stdout.readline()
        worker.send_signal(signal.SIGTERM)
        gate.touch()
        code, out = finish(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == 0, out
    assert "SIGTERM while starting" in out and "SIGTERM: stopping" in out
    assert status_of(db, job_id) == "queued" and not executions(db, job_id)


def test_a_second_sigterm_while_the_worker_starts_up_ends_it_at_once(db: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    worker = start_worker(db, env={"JOBBUS_TEST_IMPORT_GATE": str(gate)}, app="tests.gated_import_app:app")
    try:
        assert worker.stdout is not None and "importing" in worker.stdout.readline()
        worker.send_signal(signal.SIGTERM)
        # Two signals sent at once may be delivered as one: the second goes once the first is held.
        assert "SIGTERM while starting" in worker.stdout.readline()
        worker.send_signal(signal.SIGTERM)
        code, _ = finish(worker, timeout=20)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == -signal.SIGTERM


def test_cancelling_a_running_cooperative_job_records_cancelled(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("cooperative", {"steps": 2000})
    with workers(db, 1, env={"JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}) as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        assert sync_app.sync.cancel(job_id) is jobbus.JobStatus.RUNNING
        wait_until(lambda: status_of(db, job_id) == "cancelled", timeout=10, what="cancelled")
        assert worker.poll() is None
    job = sync_app.sync.find(job_id)
    assert job is not None and job.result is None and job.finished_at is not None


def test_run_once_and_limit_never_take_more_than_allowed(db: str, sync_app: jobbus.App) -> None:
    sync_app.sync.schedule_many("record", [{} for _ in range(10)])
    with workers(db, 1, "--run-once", "--concurrency", "8") as (worker,):
        code, _ = finish(worker)
    assert code == 0
    assert len(executions(db)) == 1
    with workers(db, 1, "--limit", "3", "--concurrency", "8") as (worker,):
        code, _ = finish(worker)
    assert code == 0
    assert len(executions(db)) == 4
    assert Counter(s for (s,) in query(db, "SELECT status FROM jobbus.job")) == Counter(completed=4, queued=6)


def test_memory_limit_stops_claiming_and_exits_75(db: str, sync_app: jobbus.App) -> None:
    sync_app.sync.schedule_many("hog", [{"bytes": 64 * 2**20} for _ in range(5)])
    with workers(db, 1, "--memory-limit", "40M", "--concurrency", "1") as (worker,):
        code, out = finish(worker)
    assert code == 75, out
    assert "memory limit" in out
    assert len(executions(db)) == 1
    assert Counter(s for (s,) in query(db, "SELECT status FROM jobbus.job")) == Counter(completed=1, queued=4)


def test_worker_restarted_under_the_same_id_reclaims_its_orphans_at_once(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 60, "first_only": True})
    with workers(db, 1, "--worker-id", "pod-0") as (first,):  # default lease: 300 s
        wait_until(lambda: executions(db, job_id), what="the first attempt to start")
        first.kill()
        first.wait()
        again = start_worker(db, "--worker-id", "pod-0", "--stop-when-empty")
        try:
            code, out = finish(again, timeout=30)
        finally:
            again.kill()
    assert code == 0, out
    job = sync_app.sync.find(job_id)
    assert job is not None and (job.status, job.attempts) == (jobbus.JobStatus.COMPLETED, 2)


@pytest.mark.parametrize("target", ["tests.apps:make_app", "tests.apps:lifespan"])
def test_app_factories_and_lifespans_own_the_whole_run(db: str, sync_app: jobbus.App, target: str) -> None:
    job_id = sync_app.sync.schedule("record")
    with workers(db, 1, "--stop-when-empty", app=target) as (worker,):
        code, out = finish(worker)
    assert code == 0, out
    assert status_of(db, job_id) == "completed"
    if target.endswith("lifespan"):
        assert [e for (e,) in query(db, "SELECT event FROM public.lifecycle ORDER BY at")] == ["enter", "exit"]


def test_lifespan_is_exited_on_sigterm(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 1})
    with workers(db, 1, app="tests.apps:lifespan") as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out
    assert [e for (e,) in query(db, "SELECT event FROM public.lifecycle ORDER BY at")] == ["enter", "exit"]


def test_a_second_process_under_a_live_worker_id_is_refused_and_the_first_keeps_running(
    db: str, sync_app: jobbus.App
) -> None:
    with workers(db, 1, "--worker-id", "pod-x") as (first,):
        wait_until(lambda: query(db, "SELECT 1 FROM jobbus.worker WHERE id = 'pod-x'"), what="registration")
        second = start_worker(db, "--worker-id", "pod-x")
        code, out = finish(second, timeout=30)
        assert code == 78, out
        assert "worker id 'pod-x' is in use by a live worker" in out and f"pid {first.pid}" in out
        job_id = sync_app.sync.schedule("record")
        wait_until(lambda: status_of(db, job_id) == "completed", what="the first worker to keep working")
        assert [pid for _, _, pid in executions(db, job_id)] == [first.pid]


def test_after_a_stop_command_one_sigterm_does_not_skip_the_wait(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 3})
    with workers(db, 1, "--worker-id", "pod-stop") as (worker,):
        wait_until(lambda: executions(db, job_id), what="the job to start")
        stop = subprocess.run(
            [sys.executable, "-m", "jobbus", "stop", "--worker-id", "pod-stop", "--wait", "--dsn", db],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert stop.returncode == 0, stop.stderr
        worker.send_signal(signal.SIGTERM)  # the first signal: still the graceful stop, not the second
        code, out = finish(worker, timeout=30)
    assert code == 0, out
    assert "skipping the wait" not in out
    assert status_of(db, job_id) == "completed"


def test_a_second_signal_ends_a_shutdown_stuck_on_the_database_within_seconds(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("record", {"sleep": 1})
    with workers(db, 1) as (worker,), psycopg.connect(db) as blocker:
        wait_until(lambda: executions(db, job_id), what="the job to start")
        # Its outcome write now waits on this row lock, like a database that stopped answering.
        blocker.execute("SELECT 1 FROM jobbus.job WHERE id = %s FOR UPDATE", (job_id,))
        worker.send_signal(signal.SIGTERM)
        time.sleep(2)  # the job has finished; its outcome cannot be written
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code, _ = finish(worker, timeout=30)
        assert time.monotonic() - started < 15
        blocker.rollback()
    assert code == 0


def test_a_worker_killed_mid_batch_loses_nothing_each_job_is_recovered_on_its_own(
    db: str, sync_app: jobbus.App
) -> None:
    ids = sync_app.sync.schedule_many("record_batch", [{"sleep": 60} for _ in range(5)])
    with workers(db, 1, env=SHORT_LEASE) as (first,):
        wait_until(lambda: len(executions(db)) == 5, what="the batch's call to start")
        assert {pid for _, _, pid in executions(db)} == {first.pid}
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert {status_of(db, job_id) for job_id in ids} == {"running"}  # leases that will expire
        second = start_worker(db, env=SHORT_LEASE)
        try:
            wait_until(
                lambda: {status_of(db, job_id) for job_id in ids} == {"completed"},
                timeout=30,
                what="every job of the batch completed by the second worker",
            )
            second.send_signal(signal.SIGTERM)
            code, out = finish(second)
        finally:
            second.kill()
    assert code == 0, out
    for job_id in ids:
        job = sync_app.sync.find(job_id)
        assert job is not None and (job.status, job.attempts) == (jobbus.JobStatus.COMPLETED, 2)
        assert job.result == {"pid": second.pid, "attempt": 2}
        assert [attempt for _, attempt, _ in executions(db, job_id)] == [1, 2]
