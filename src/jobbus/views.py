"""The operator's views of jobs over an open `App`: pages of a view and counts that never mislead.

The dashboard's jobs page, overview and failures page and `jobbus jobs list` / `jobbus status` read
jobs and numbers through these functions, so they show the same jobs and agree about the same moment.
A count is exact when at most `COUNT_CAP` jobs match (read along an index at request time); past that,
it is the planner's estimate of the same jobs, never less than what was read, and says so
(`Count.estimated`: shown with ≈, `"estimated": true` in JSON).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, TypeVar

from jobbus.models import Job
from jobbus.store.dashboard import DashboardStore, FailureGroup
from jobbus.store.statements import Statement, run_async
from jobbus.store.views import COUNT_CAP, FINISHED, VIEWS, Count, Cursor, Filters, Page, ViewStore

if TYPE_CHECKING:
    from jobbus.app import App

__all__ = [
    "COUNT_CAP",
    "VIEWS",
    "Count",
    "Cursor",
    "Filters",
    "Page",
    "count",
    "counts",
    "cursor_after",
    "jobs_of",
    "page",
]

_T = TypeVar("_T")
#: No filter: every job of the view.
ANY = Filters()
#: The tabs of the jobs page, each with its count.
TABS = ("queued", "scheduled", "retrying", "waiting", "running", "completed", "failed", "cancelled")


async def page(app: App, view: str, filters: Filters = ANY, *, cursor: Cursor | None = None, limit: int = 50) -> Page:
    """One page of `view` in its order, from `cursor` (`Page.next` of the page before)."""
    return await _run(app, _store(app.settings.schema).page(view, filters, cursor=cursor, limit=limit))


async def count(app: App, view: str, filters: Filters = ANY, *, cap: int = COUNT_CAP) -> Count:
    """How many jobs of `view` match `filters`: exact up to `cap`, else the planner's estimate."""
    store = _store(app.settings.schema)
    value, past_cap = await _run(app, store.count(view, filters, cap=cap))
    if not past_cap:
        return Count(value)
    return Count.estimate(value, await _run(app, store.estimate(view, filters)))


async def counts(app: App, filters: Filters = ANY, *, views: tuple[str, ...] = TABS) -> dict[str, Count]:
    """The count of each of `views` under the same filters (the jobs page's tabs)."""
    return {view: await count(app, view, filters) for view in views}


async def pairs(app: App, view: str) -> list[tuple[str, str]]:
    """Every (queue, type) pair of `view`'s jobs: the choices of its filters."""
    return await _run(app, _store(app.settings.schema).pairs(view))


async def jobs_of(app: App, page: Page) -> list[Job]:
    """The jobs of a page read whole (every column, the configuration and result included), in its order."""
    return await _run(app, app.store.find_jobs([job.id for job in page.jobs]))


def cursor_after(view: str, job: Job) -> Cursor:
    """The cursor of the page of `view` that follows `job` (a job of that view)."""
    if view in (*FINISHED, "finished"):
        return Cursor(job.id, job.finished_at)
    if view == "running":
        return Cursor(job.id, job.started_at)
    return Cursor(job.id, job.available_at)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One queue as `jobbus status` and the dashboard's overview show it, read at one moment."""

    queue: str
    paused: bool
    #: Every queued job; `available` those that could run now; `scheduled` the scheduled view's.
    queued: Count
    available: Count
    scheduled: Count
    running: Count
    completed: Count
    failed: Count
    cancelled: Count
    #: How long the oldest job that could run now has waited (None: none waits).
    oldest_waiting_seconds: float | None
    completed_last_minute: Count
    failed_last_hour: Count


async def queue_table(app: App, *, paused: Iterable[str] = (), also: Iterable[str] = ()) -> list[QueueStatus]:
    """Every queue that holds a job (and those `paused` or `also` named), each counted now: exact up to
    `COUNT_CAP` along each of its ranges, else the planner's estimate."""
    store = _store(app.settings.schema)
    read: dict[str, dict[str, Count]] = {}
    oldest: dict[str, float] = {}
    for queue, what, n, past_cap in await _run(app, store.queue_counts()):
        if what == "oldest":
            oldest[queue] = float(n)
            continue
        count = Count(n)
        if past_cap:
            count = Count.estimate(n, await _run(app, store.queue_estimate(what, queue)))
        read.setdefault(queue, {})[what] = count
    paused_queues = set(paused)
    table = []
    for queue in sorted(set(read) | paused_queues | set(also)):
        counts = read.get(queue, {})

        def of(what: str, counts: dict[str, Count] = counts) -> Count:
            return counts.get(what, Count(0))

        table.append(
            QueueStatus(
                queue=queue,
                paused=queue in paused_queues,
                queued=of("queued"),
                available=of("available"),
                scheduled=of("scheduled"),
                running=of("running"),
                completed=of("completed"),
                failed=of("failed"),
                cancelled=of("cancelled"),
                oldest_waiting_seconds=oldest.get(queue),
                completed_last_minute=of("completed_minute"),
                failed_last_hour=of("failed_hour"),
            )
        )
    return table


async def failure_groups(app: App) -> list[FailureGroup]:
    """Every failure group over every failed job, the most recent first, counted as views count."""
    store = DashboardStore(app.settings.schema)
    groups = []
    for group, past_cap in await _run(app, store.failures()):
        if past_cap:
            estimate = await _run(app, store.failure_estimate(group.pattern))
            group = replace(group, count=Count.estimate(group.count.value, estimate))
        groups.append(group)
    return groups


async def retry_failure_group(app: App, pattern: str) -> tuple[int, int]:
    """Retry every failed job of a failure group, in batches; returns how many were retried and how many
    were left failed because another active job holds their unique key."""
    kept: list[uuid.UUID] = []
    retried = 0
    while True:
        chosen, done, left = await _run(app, app.store.retry_failure_group(pattern, skip=kept))
        retried += done
        kept += left
        if chosen == 0:
            return retried, len(kept)


@cache
def _store(schema: str) -> ViewStore:
    return ViewStore(schema)


async def _run(app: App, statement: Statement[_T]) -> _T:
    async with app.pool.connection() as conn:
        return await run_async(conn, statement)
