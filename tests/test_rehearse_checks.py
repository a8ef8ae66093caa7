"""The upgrade rehearsal's verdicts (tools/rehearse_checks.py) on histories that keep them and that break
them, and its command's refusals of bad input. The rehearsal itself runs as a CI step
(`make rehearse-upgrade` at a small size, .ci/run)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

from tools.rehearse_checks import JobRow, Outcome, Start, check_attempts, check_jobs, scan_log
from tools.rehearse_upgrade import ROOT

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
JOB = uuid.UUID("01a2503d-d3bc-70da-9eae-9cc94115c1db")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def retried_job(**changes: object) -> JobRow:
    """A job whose first attempt failed and whose second completed at 3 s."""
    values: dict[str, object] = dict(
        id=JOB,
        status="completed",
        attempts=2,
        finished_at=at(3),
        history=(Outcome(1, "retried", at(1)), Outcome(2, "completed", at(3))),
    )
    values.update(changes)
    return JobRow(**values)  # type: ignore[arg-type]


def starts(*times: tuple[int, float]) -> list[Start]:
    return [Start(JOB, attempt, "old", 100 + attempt, at(seconds)) for attempt, seconds in times]


def test_a_job_retried_once_and_completed_keeps_every_check() -> None:
    assert check_jobs([JOB], [JOB], [retried_job()]) == []
    assert check_attempts([retried_job()], starts((1, 0.5), (2, 2))) == []


def test_jobs_lost_unacknowledged_or_not_completed_are_named() -> None:
    other = uuid.UUID(int=7)
    assert check_jobs([JOB, other], [JOB], [retried_job()]) == [
        f"job {other} was acknowledged but is not in the database"
    ]
    assert check_jobs([], [JOB], [retried_job()]) == [f"job {JOB} is in the database but no producer acknowledged it"]
    failed = retried_job(status="failed", history=(Outcome(1, "retried", at(1)), Outcome(2, "failed", at(3))))
    assert check_jobs([JOB], [JOB], [failed]) == [f"job {JOB} ended failed, not completed (attempts 2)"]


def test_a_history_with_two_terminal_outcomes_fails() -> None:
    twice = retried_job(history=(Outcome(1, "completed", at(1)), Outcome(2, "completed", at(3))))
    assert check_jobs([JOB], [JOB], [twice]) == [
        f"job {JOB} has 2 terminal outcomes in its history (1:completed, 2:completed)"
    ]


def test_an_attempt_that_never_ran_or_ran_twice_fails() -> None:
    assert check_attempts([retried_job()], starts((2, 2))) == [f"job {JOB}: attempts [1] of 2 never started a handler"]
    problems = check_attempts([retried_job()], starts((1, 0.5), (2, 2), (2, 2.5)))
    assert problems == [f"job {JOB}: attempt 2 started its handler 2 times"]
    problems = check_attempts([retried_job()], starts((1, 0.5), (2, 2), (3, 2.5)))
    assert problems == [
        f"job {JOB}: a handler ran attempt 3, the job records 2",
        f"job {JOB}: attempt 3 (old worker, pid 103) started before attempt 2's outcome completed",
    ]


def test_a_handler_that_ran_after_another_attempts_outcome_fails() -> None:
    # Attempt 1's handler started again (a stale worker) after attempt 2 had completed.
    problems = check_attempts([retried_job()], [*starts((2, 2)), Start(JOB, 1, "new", 7, at(4))])
    assert problems == [
        f"job {JOB}: attempt 1 (new worker, pid 7) started after attempt 2's outcome completed",
        f"job {JOB}: attempt 1 (new worker, pid 7) started after the job finished completed",
    ]
    # Attempt 2 started before attempt 1's outcome was written: two attempts at once.
    problems = check_attempts([retried_job()], starts((1, 0.5), (2, 0.8)))
    assert problems == [f"job {JOB}: attempt 2 (old worker, pid 102) started before attempt 1's outcome retried"]


def test_a_handler_run_for_a_job_nobody_scheduled_fails() -> None:
    assert check_attempts([], starts((1, 0.5))) == [f"job {JOB}: a handler ran for a job of no acknowledged row"]


WORKER_LOG = """\
2026-12-07 11:22:38,101 INFO jobbus.worker: worker old-worker-1 started
2026-12-07 11:22:39,969 WARNING jobbus.worker: job 01a2 attempt 1 of 3 failed, retrying in 0.2 s: x
Traceback (most recent call last):
  File "/work/tools/rehearse_app.py", line 66, in work
    raise PlannedRetry(f"job {job.configuration.get('n')} fails its first attempt on purpose")
tools.rehearse_app.PlannedRetry: job 3 fails its first attempt on purpose
2026-12-07 11:22:40,001 INFO jobbus.worker: stopping: 0 jobs in flight
"""


def test_a_clean_log_with_planned_retries_passes() -> None:
    assert scan_log(WORKER_LOG) == []


def test_errors_and_unplanned_tracebacks_in_a_log_are_named() -> None:
    error = "2026-12-07 11:22:41,000 ERROR jobbus.worker: claim failed: deadlock detected"
    assert scan_log(WORKER_LOG + error + "\n") == [error]
    warning = "2026-12-07 11:22:41,000 WARNING jobbus.worker: heartbeat failed"
    unplanned = f"{warning}\nTraceback (most recent call last):\npsycopg.errors.DeadlockDetected: deadlock detected\n"
    assert scan_log(WORKER_LOG + unplanned) == [f"{warning} (with a traceback)"]
    retried = (
        "2026-12-07 11:22:41,000 WARNING jobbus.worker: completer hit a transient database error"
        " (DeadlockDetected: deadlock detected); retrying with backoff"
    )
    assert scan_log(WORKER_LOG + retried + "\n") == [retried]
    crash = "Traceback (most recent call last):\nKeyError: 'x'\n"
    assert scan_log(crash) == ["Traceback (most recent call last):", "KeyError: 'x'"]


def rehearse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.rehearse_upgrade", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_rehearsal_refuses_bad_input_naming_it() -> None:
    done = rehearse("--seconds", "0")
    assert done.returncode == 2
    assert "--seconds: must be a finite number above 0, got '0'" in done.stderr
    done = rehearse("--jobs", "-5")
    assert done.returncode == 2
    assert "--jobs: must be 0 or more, got '-5'" in done.stderr
    done = rehearse("--previous", "nosuchcommit")
    assert done.returncode == 1
    assert "--previous 'nosuchcommit' is not a commit of this repository" in done.stderr
