"""Statements of the web dashboard (`sql/queries/dashboard.sql`): every one bounded on any table size."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobbus.models import Job
from jobbus.store.jobs import job_from_row
from jobbus.store.statements import Row, Statement, queries

#: How many index entries one list request walks at most (filters look inside this window).
WINDOW = 5000
#: How many finished jobs the failures page groups at most.
FAILURE_WINDOW = 20000
#: The job page shows this many steps and children at once (children page on: "next 50").
FAMILY_LIMIT = 50
#: A step's result larger than this (as stored) is not read for the job page.
STEP_RESULT_BYTES = 16384
#: Counts read at request time (stale samples, work nobody takes) stop at this many rows each.
COUNT_CAP = 10_000


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job as the lists show it (no payloads)."""

    id: uuid.UUID
    status: str
    queue: str
    type: str
    name: str | None
    attempts: int
    max_attempts: int
    priority: int
    created_at: datetime
    available_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    worker_id: str | None
    progress_current: float | None
    progress_total: float | None
    group_id: uuid.UUID | None
    #: The configuration when it is at most `PREVIEW_BYTES` stored (the list previews it), else None.
    configuration: dict[str, Any] | None
    configuration_bytes: int


@dataclass(frozen=True, slots=True)
class Choice:
    """One queue or type of the jobs page's filters, with the count of its jobs (capped: "1,000+")."""

    name: str
    count: int
    capped: bool


@dataclass(frozen=True, slots=True)
class Choices:
    """The (queue, type) pairs of the jobs of one status or view, each with its bounded count."""

    pairs: list[tuple[str, str, int, bool]]

    def queues(self, *, type: str | None) -> list[Choice]:
        """The queues with their counts, within `type` when one is chosen."""
        return _facet([(q, n, c) for q, t, n, c in self.pairs if type is None or t == type])

    def types(self, *, queue: str | None) -> list[Choice]:
        """The types with their counts, within `queue` when one is chosen."""
        return _facet([(t, n, c) for q, t, n, c in self.pairs if queue is None or q == queue])


def _facet(rows: list[tuple[str, int, bool]]) -> list[Choice]:
    counts: dict[str, int] = {}
    capped: set[str] = set()
    for name, n, cap in rows:
        counts[name] = counts.get(name, 0) + n
        if cap:
            capped.add(name)
    return [Choice(name, counts[name], name in capped) for name in sorted(counts)]


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: the sort key of the last row seen (hit or merely scanned)."""

    id: uuid.UUID
    at: datetime | None = None
    priority: int | None = None
    queue: str | None = None
    type: str | None = None

    def encode(self) -> str:
        """An opaque, URL-safe token."""
        fields = [str(self.id), self.at.isoformat() if self.at else None, self.priority, self.queue, self.type]
        return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor | None:
        """The cursor of a token; None for anything that is not one (a stale or edited link)."""
        try:
            raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            job_id, at, priority, queue, type_ = raw
            return cls(
                uuid.UUID(job_id),
                datetime.fromisoformat(at) if at else None,
                int(priority) if priority is not None else None,
                str(queue) if queue is not None else None,
                str(type_) if type_ is not None else None,
            )
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobSummary]
    #: None: nothing older; else pass it back for the next page.
    next: Cursor | None
    #: How many index entries this page walked (at most `WINDOW`).
    scanned: int


@dataclass(frozen=True, slots=True)
class FailureGroup:
    error_class: str
    pattern: str
    example: str
    count: int
    last_at: datetime
    first_at: datetime
    types: list[str]
    queues: list[str]
    ids: list[uuid.UUID]

    @property
    def key(self) -> str:
        """What names the group in a page and its retry form: a digest, since the pattern is an error
        message (only folded) and may hold what redaction hides in the message shown."""
        return hashlib.sha256(self.pattern.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class QueueRow:
    queue: str
    available: int
    scheduled: int
    running: int
    oldest_available_seconds: float | None
    sampled_at: datetime | None
    paused: bool


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


STATUS_MODES = {
    None: "dashboard_jobs_all",
    "queued": "dashboard_jobs_queued",
    "running": "dashboard_jobs_running",
    "completed": "dashboard_jobs_finished",
    "failed": "dashboard_jobs_finished",
    "cancelled": "dashboard_jobs_finished",
    "finished": "dashboard_jobs_finished",
    # The views of queued jobs (jobbus.models.JOB_VIEWS) walk the queued jobs' index with a filter.
    "scheduled": "dashboard_jobs_queued",
    "retrying": "dashboard_jobs_queued",
    "waiting": "dashboard_jobs_queued",
}
#: The bound of each count of the jobs page's tabs.
TAB_COUNT_CAP = 5_000
#: The bound of each (queue, type) count of the jobs page's filter choices.
CHOICE_CAP = 1_000
#: A job's configuration is previewed in the lists when it is stored in at most this many bytes.
PREVIEW_BYTES = 2048


@dataclass(frozen=True, slots=True)
class JobCounts:
    """The tabs of the jobs page: each count, and whether it reached its bound (then "5,000+")."""

    counts: dict[str, int]
    capped: frozenset[str]


class DashboardStore:
    """Builds the dashboard's statements for one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._q = queries(schema)

    def job_counts(self, *, queue: str | None, type: str | None, cap: int = TAB_COUNT_CAP) -> Statement[JobCounts]:
        """A bounded count per status and per view (dashboard_job_counts)."""

        def decode(rows: list[Row], _: int) -> JobCounts:
            queued, running, finished, completed, failed, cancelled, scheduled, retrying, waiting = map(int, rows[0])
            counts = {
                "queued": queued,
                "running": running,
                "completed": completed,
                "failed": failed,
                "cancelled": cancelled,
                "scheduled": scheduled,
                "retrying": retrying,
                "waiting": waiting,
            }
            capped = set()
            if queued >= cap:
                capped |= {"queued", "scheduled", "retrying", "waiting"}
            if running >= cap:
                capped.add("running")
            if finished >= cap:
                capped |= {"completed", "failed", "cancelled"}
            return JobCounts(counts, frozenset(capped))

        params = {"queue": queue, "type": type, "cap": cap}
        return Statement(self._q["dashboard_job_counts"], params, decode)

    def job_choices(
        self, *, status: str | None, cap: int = CHOICE_CAP, view_cap: int = TAB_COUNT_CAP
    ) -> Statement[Choices]:
        """The queue and type choices of the jobs page for `status` (a status, a view, "finished" or
        None for all), each count bounded (dashboard_job_choices); a view's among the `view_cap`
        queued rows its tab counts."""
        view = status if status in ("scheduled", "retrying", "waiting") else None
        finished = ("completed", "failed", "cancelled")
        params = {
            "queued": status in (None, "queued"),
            "view": view,
            "running": status in (None, "running"),
            "finished": status in (None, "finished", *finished),
            "statuses": [status] if status in finished else None,
            "cap": cap,
            "view_cap": view_cap,
        }

        def decode(rows: list[Row], _: int) -> Choices:
            return Choices([(str(r[0]), str(r[1]), int(r[2]), bool(r[3])) for r in rows])

        return Statement(self._q["dashboard_job_choices"], params, decode)

    def list_jobs(
        self,
        *,
        status: str | None,
        queue: str | None,
        type: str | None,
        group_id: uuid.UUID | None,
        text: str | None,
        cursor: Cursor | None,
        limit: int,
        window: int = WINDOW,
    ) -> Statement[JobPage]:
        """One page of jobs along the index that fits the status (see dashboard.sql)."""
        name = "dashboard_jobs_in_group" if group_id is not None else STATUS_MODES[status]
        statuses = None
        view = status if status in ("scheduled", "retrying", "waiting") else None
        if status in ("completed", "failed", "cancelled") or (group_id is not None and status is not None):
            statuses = ["completed", "failed", "cancelled"] if status == "finished" else [status]
            if view is not None:  # within a group (a few rows): its queued jobs
                statuses = ["queued"]
        params: dict[str, Any] = {
            "id": cursor.id if cursor else None,
            "at": cursor.at if cursor else None,
            "priority": cursor.priority if cursor else None,
            "cursor_queue": cursor.queue if cursor else None,
            "cursor_type": cursor.type if cursor else None,
            "statuses": statuses,
            "view": view,
            "queue": queue,
            "type": type,
            "group_id": group_id,
            "text": f"%{_escape_like(text)}%" if text else None,
            "limit": limit,
            "window": window,
            "preview_bytes": PREVIEW_BYTES,
        }
        if (
            name == "dashboard_jobs_queued"
            and cursor is not None
            and None in (cursor.at, cursor.priority, cursor.queue)
        ):
            params["id"] = None  # not a cursor of this list: start from its beginning

        def decode(rows: list[Row], _: int) -> JobPage:
            jobs = sorted((JobSummary(*row[1:2], *row[3:]) for row in rows if row[0] == "job"), key=_ORDER[name])
            end = next(row for row in rows if row[0] == "end")
            scanned = int(end[3])
            next_cursor: Cursor | None = None
            if len(jobs) >= limit:
                last = jobs[-1]
                next_cursor = _cursor_of(name, last)
            elif scanned >= window and end[1] is not None:
                next_cursor = Cursor(end[1], end[2], end[9], end[4], end[5])
            return JobPage(jobs, next_cursor, scanned)

        return Statement(self._q[name], params, decode, prepare=False)

    def failures(
        self, *, limit: int = 50, ids: int = 1000, window: int = FAILURE_WINDOW
    ) -> Statement[list[FailureGroup]]:
        def decode(rows: list[Row], _: int) -> list[FailureGroup]:
            return [
                FailureGroup(r[0], r[1], r[2], int(r[3]), r[4], r[5], list(r[6]), list(r[7]), list(r[8])) for r in rows
            ]

        params = {"limit": limit, "ids": ids, "window": window}
        return Statement(self._q["dashboard_failures"], params, decode)

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

    def latest_sample(self) -> Statement[list[QueueRow]]:
        return Statement(self._q["dashboard_latest_sample"], {}, lambda rows, _: [QueueRow(*r) for r in rows])

    def sample_age(self) -> Statement[float | None]:
        """Seconds since the leader's latest queue sample; None when there is none."""
        return Statement(
            self._q["dashboard_sample_age"], {}, lambda rows, _: None if rows[0][0] is None else float(rows[0][0])
        )

    def counts_now(self, *, cap: int = COUNT_CAP) -> Statement[list[QueueRow]]:
        """The queue table read now, for when the samples are stale: every count at most `cap`."""
        return Statement(self._q["dashboard_counts_now"], {"cap": cap}, lambda rows, _: [QueueRow(*r) for r in rows])

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


_EPOCH = datetime.fromtimestamp(0, UTC)
#: The order of each list (the join back to the rows does not keep the window's order).
_ORDER: dict[str, Callable[[JobSummary], Any]] = {
    "dashboard_jobs_all": lambda j: _Desc(j.id.bytes),
    "dashboard_jobs_in_group": lambda j: _Desc(j.id.bytes),
    "dashboard_jobs_finished": lambda j: _Desc(((j.finished_at or _EPOCH).timestamp(), j.id.bytes)),
    "dashboard_jobs_running": lambda j: _Desc(((j.started_at or _EPOCH).timestamp(), j.id.bytes)),
    "dashboard_jobs_queued": lambda j: 0,  # kept in the database's order: its collation sorts the names
}


class _Desc:
    """Reverses the order of a sort key."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return bool(self.key > other.key)


def _cursor_of(name: str, job: JobSummary) -> Cursor:
    if name == "dashboard_jobs_finished":
        return Cursor(job.id, job.finished_at)
    if name == "dashboard_jobs_queued":
        return Cursor(job.id, job.available_at, job.priority, job.queue, job.type)
    if name == "dashboard_jobs_running":
        return Cursor(job.id, job.started_at)
    return Cursor(job.id)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
