"""Statements of the web dashboard (`sql/queries/dashboard.sql`): every one bounded on any table size."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobbus.models import Job
from jobbus.store.jobs import job_from_row
from jobbus.store.statements import Row, Statement, queries
from jobbus.store.views import COUNT_CAP, Count, decode_estimate

#: How many steps, children or groups the job and groups pages read at most for one page.
WINDOW = 5000
#: A failure group's types and queues are read from its newest this many failures.
FAILURE_SAMPLE = 1000
#: The job page shows this many steps and children at once (children page on: "next 50").
FAMILY_LIMIT = 50
#: A step's result larger than this (as stored) is not read for the job page.
STEP_RESULT_BYTES = 16384


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """Failed jobs whose errors fold alike (`pattern`, their `error_group`), however many."""

    pattern: str
    #: The newest failure's message.
    example: str
    count: Count
    last_at: datetime
    first_at: datetime
    #: The types and queues of the group's newest `FAILURE_SAMPLE` failures.
    types: list[str]
    queues: list[str]

    @property
    def error_class(self) -> str:
        return self.pattern.split(":", 1)[0]

    @property
    def sampled(self) -> bool:
        """Whether `types` and `queues` are those of a part of the group only."""
        return self.count.value > FAILURE_SAMPLE

    @property
    def key(self) -> str:
        """What names the group in a page and its retry form: a digest, since the pattern is an error
        message (only folded) and may hold what redaction hides in the message shown."""
        return failure_key(self.pattern)


def failure_key(pattern: str) -> str:
    return hashlib.sha256(pattern.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    bucket: int
    completed: int
    failed: int
    cancelled: int
    available: int
    running: int
    oldest_available_seconds: float | None
    first_sampled_at: datetime


@dataclass(frozen=True, slots=True)
class Series:
    """The charts' buckets (only those with samples), the first starting at `since`."""

    since: datetime
    points: list[SeriesPoint]


@dataclass(frozen=True, slots=True)
class GroupRow:
    group_id: uuid.UUID
    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int
    total: int
    types: list[str]

    @property
    def completion_percentage(self) -> float:
        return 0.0 if not self.total else (self.completed + self.failed + self.cancelled) * 100.0 / self.total


@dataclass(frozen=True, slots=True)
class CommandRow:
    generation: int
    action: str
    target_kind: str
    target: str
    issued_at: datetime
    worker_ids: list[str]
    acknowledged: list[str]
    pending: list[str]


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: uuid.UUID
    type: str
    queue: str
    started_at: datetime | None
    progress_current: float | None
    progress_total: float | None
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobPageRow:
    """A job as its page reads it: without steps, with its parent's type and status (None: no parent,
    or the parent is gone)."""

    job: Job
    parent_type: str | None
    parent_status: str | None


@dataclass(frozen=True, slots=True)
class StepRow:
    """A durable step as recorded; `result` is None when it is larger than `STEP_RESULT_BYTES` (`size`)."""

    name: str
    result: Any
    size: int
    attempt: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Steps:
    rows: list[StepRow]
    #: Steps other than spawns among those read (at most the window's).
    total: int


@dataclass(frozen=True, slots=True)
class ChildRow:
    id: uuid.UUID
    type: str
    status: str
    attempts: int
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class Children:
    rows: list[ChildRow]
    #: Children after the cursor among those read (at most the window's).
    total: int
    #: The parent's children not yet terminal; None when it never spawned one.
    active: int | None


class DashboardStore:
    """Builds the dashboard's statements for one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._q = queries(schema)

    def failures(
        self, *, cap: int = COUNT_CAP, sample: int = FAILURE_SAMPLE
    ) -> Statement[list[tuple[FailureGroup, bool]]]:
        """Every failure group, the most recent first, each with whether its count went past `cap` (then
        its count is `cap` + 1, and `failure_estimate` says more)."""

        def decode(rows: list[Row], _: int) -> list[tuple[FailureGroup, bool]]:
            return [
                (FailureGroup(r[0], r[1] or "", Count(int(r[4])), r[2], r[3], list(r[5]), list(r[6])), int(r[4]) > cap)
                for r in rows
            ]

        return Statement(self._q["dashboard_failures"], {"cap": cap, "sample": sample}, decode, prepare=False)

    def failure_estimate(self, pattern: str) -> Statement[int]:
        """The planner's estimate of a failure group's jobs."""
        return Statement(self._q["dashboard_failure_estimate"], {"group": pattern}, decode_estimate, prepare=False)

    def job(self, job_id: uuid.UUID) -> Statement[JobPageRow | None]:
        """One job without its steps (dashboard_job)."""

        def decode(rows: list[Row], _: int) -> JobPageRow | None:
            return JobPageRow(job_from_row(rows[0][:-2]), rows[0][-2], rows[0][-1]) if rows else None

        return Statement(self._q["dashboard_job"], {"id": job_id}, decode)

    def job_steps(
        self, job_id: uuid.UUID, *, limit: int = FAMILY_LIMIT, window: int = WINDOW, max_bytes: int = STEP_RESULT_BYTES
    ) -> Statement[Steps]:
        """A job's first steps in recorded order, spawns left out."""

        def decode(rows: list[Row], _: int) -> Steps:
            return Steps([StepRow(*r[:5]) for r in rows], int(rows[0][5]) if rows else 0)

        params = {"id": job_id, "limit": limit, "window": window, "max_bytes": max_bytes}
        return Statement(self._q["dashboard_job_steps"], params, decode)

    def job_children(
        self, job_id: uuid.UUID, *, after: uuid.UUID | None = None, limit: int = FAMILY_LIMIT, window: int = WINDOW
    ) -> Statement[Children]:
        """A parent's children in creation order after `after`, with statuses."""

        def decode(rows: list[Row], _: int) -> Children:
            kids = [ChildRow(*r[2:]) for r in rows if r[2] is not None]
            return Children(kids, int(rows[0][0]), None if rows[0][1] is None else int(rows[0][1]))

        params = {"id": job_id, "after": after, "limit": limit, "window": window}
        return Statement(self._q["dashboard_job_children"], params, decode)

    def sample_age(self) -> Statement[float | None]:
        """Seconds since the leader's latest queue sample; None when there is none."""
        return Statement(
            self._q["dashboard_sample_age"], {}, lambda rows, _: None if rows[0][0] is None else float(rows[0][0])
        )

    def series(self, *, width: int = 60, buckets: int = 60, queue: str | None = None) -> Statement[Series]:
        """`buckets` buckets of `width` seconds of the leader's samples, the last ending at the next
        multiple of `width` (dashboard_series)."""

        def decode(rows: list[Row], _: int) -> Series:
            points = [
                SeriesPoint(int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), r[7], r[8])
                for r in rows
                if r[1] is not None
            ]
            return Series(rows[0][0], points)

        params = {"width": width, "buckets": buckets, "queue": queue}
        return Statement(self._q["dashboard_series"], params, decode)

    def estimated_jobs(self) -> Statement[int | None]:
        """The planner's estimate of the job table's rows; None before the table was first analyzed."""
        params = {"schema_name": self.schema}
        return Statement(
            self._q["dashboard_estimates"],
            params,
            lambda rows, _: int(rows[0][0]) if rows and rows[0][0] >= 0 else None,
        )

    def recent_groups(
        self, *, limit: int = 50, window: int = WINDOW, group_window: int = 100_000
    ) -> Statement[list[GroupRow]]:
        def decode(rows: list[Row], _: int) -> list[GroupRow]:
            return [
                GroupRow(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), list(r[7] or []))
                for r in rows
            ]

        params = {"limit": limit, "window": window, "group_window": group_window}
        return Statement(self._q["dashboard_recent_groups"], params, decode)

    def commands(self, *, limit: int = 20) -> Statement[list[CommandRow]]:
        def decode(rows: list[Row], _: int) -> list[CommandRow]:
            return [CommandRow(r[0], r[1], r[2], r[3], r[4], list(r[5]), list(r[6]), list(r[7])) for r in rows]

        return Statement(self._q["dashboard_commands"], {"limit": limit}, decode)

    def running_of_worker(self, worker_id: str, *, limit: int = 200) -> Statement[list[RunningJob]]:
        params = {"worker_id": worker_id, "limit": limit}
        return Statement(self._q["dashboard_running_of_worker"], params, lambda rows, _: [RunningJob(*r) for r in rows])

    def pulse(self) -> Statement[tuple[Any, ...]]:
        return Statement(self._q["dashboard_pulse"], {}, lambda rows, _: tuple(rows[0]))
