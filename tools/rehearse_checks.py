"""The upgrade rehearsal's verdicts: what the job rows, the handlers' starts and the processes' logs must show.

Pure functions over what the rehearsal read, so that each can be shown to fail on a history that breaks it
(tests/test_rehearse_checks.py). Each returns a list of problems, one sentence each; empty means it holds.
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Outcome:
    """One entry of a job's history: what attempt `attempt` ended with, on the database's clock."""

    attempt: int
    outcome: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobRow:
    id: uuid.UUID
    status: str
    attempts: int
    finished_at: datetime | None
    history: tuple[Outcome, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Start:
    """A handler's start of one attempt, recorded by the handler itself (public.rehearsal_start)."""

    job_id: uuid.UUID
    attempt: int
    role: str
    pid: int
    started_at: datetime


#: History outcomes that end a job; a job's history holds exactly one, as its last entry.
TERMINAL_OUTCOMES = frozenset({"completed", "failed", "cancelled", "expired"})


def check_jobs(acked: Iterable[uuid.UUID], scheduled: Iterable[uuid.UUID], rows: Iterable[JobRow]) -> list[str]:
    """Every acknowledged job exists and completed, once; no job of the load was scheduled without an
    acknowledgement. `scheduled` is every job of the rehearsal's type the database holds."""
    acked_ids, scheduled_ids = set(acked), set(scheduled)
    problems = [f"job {job_id} was acknowledged but is not in the database" for job_id in acked_ids - scheduled_ids]
    problems += [
        f"job {job_id} is in the database but no producer acknowledged it" for job_id in scheduled_ids - acked_ids
    ]
    for row in rows:
        if row.id not in acked_ids:
            continue
        terminal = [entry for entry in row.history if entry.outcome in TERMINAL_OUTCOMES]
        if row.status != "completed":
            problems.append(f"job {row.id} ended {row.status}, not completed (attempts {row.attempts})")
        elif row.finished_at is None:
            problems.append(f"job {row.id} is completed without a finish time")
        if len(terminal) != 1 or (row.history and row.history[-1] is not terminal[-1]):
            outcomes = ", ".join(f"{e.attempt}:{e.outcome}" for e in row.history) or "nothing"
            problems.append(f"job {row.id} has {len(terminal)} terminal outcomes in its history ({outcomes})")
    return problems


def check_attempts(rows: Iterable[JobRow], starts: Iterable[Start]) -> list[str]:
    """Each attempt of each job ran its handler exactly once, and no handler started after the outcome of
    a later attempt, before the outcome of an earlier one, or after the job finished."""
    by_job: defaultdict[uuid.UUID, list[Start]] = defaultdict(list)
    for start in starts:
        by_job[start.job_id].append(start)
    problems: list[str] = []
    for row in rows:
        runs = by_job.pop(row.id, [])
        counts: defaultdict[int, int] = defaultdict(int)
        for start in runs:
            counts[start.attempt] += 1
        expected = set(range(1, row.attempts + 1))
        missing = sorted(expected - set(counts))
        if missing:
            problems.append(f"job {row.id}: attempts {missing} of {row.attempts} never started a handler")
        for attempt, count in sorted(counts.items()):
            if attempt not in expected:
                problems.append(f"job {row.id}: a handler ran attempt {attempt}, the job records {row.attempts}")
            elif count > 1:
                problems.append(f"job {row.id}: attempt {attempt} started its handler {count} times")
        for start in runs:
            who = f"job {row.id}: attempt {start.attempt} ({start.role} worker, pid {start.pid})"
            for entry in row.history:
                if entry.attempt < start.attempt and entry.at > start.started_at:
                    problems.append(f"{who} started before attempt {entry.attempt}'s outcome {entry.outcome}")
                elif entry.attempt > start.attempt and entry.at < start.started_at:
                    problems.append(f"{who} started after attempt {entry.attempt}'s outcome {entry.outcome}")
            if row.finished_at is not None and start.started_at > row.finished_at:
                problems.append(f"{who} started after the job finished {row.status}")
    problems += [f"job {job_id}: a handler ran for a job of no acknowledged row" for job_id in by_job]
    return problems


#: The start of a log record as the worker and the producers format them: a time, then the level.
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) ")
#: A warning that a statement failed on the database (the worker retries it, but it erred: a deadlock with
#: the migration, a lock or statement timeout, a lost connection).
_DATABASE_TROUBLE = re.compile(r"deadlock|database error|lost the database", re.IGNORECASE)
#: A retry of an attempt failed on purpose logs a warning with its traceback: that one is expected.
_PLANNED = "rehearse_app.PlannedRetry: "


def _planned_retry(level: str, record: list[str]) -> bool:
    """A warning whose one traceback ends in the handler's PlannedRetry."""
    tracebacks = sum(line.startswith("Traceback ") for line in record)
    return level == "WARNING" and tracebacks == 1 and _PLANNED in record[-1]


def scan_log(text: str) -> list[str]:
    """The error lines of one process's output: a record at level ERROR or CRITICAL, a warning of a
    statement the database failed (retried or not), a traceback other than a planned retry's, or anything
    outside a log record that mentions an error or a traceback."""
    problems: list[str] = []
    record: list[str] = []

    def close() -> None:
        if not record:
            return
        head = _RECORD.match(record[0])
        level = head.group("level") if head else ""
        body = "\n".join(record)
        if level in ("ERROR", "CRITICAL") or (level == "WARNING" and _DATABASE_TROUBLE.search(record[0])):
            problems.append(record[0])
        elif "Traceback" in body and not _planned_retry(level, record):
            problems.append(record[0] + " (with a traceback)")
        record.clear()

    for line in text.splitlines():
        if _RECORD.match(line):
            close()
            record.append(line)
        elif record:
            record.append(line)
        elif re.search(r"error|traceback|exception", line, re.IGNORECASE):
            problems.append(line)
    close()
    return problems
