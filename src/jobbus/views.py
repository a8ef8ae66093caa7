"""The operator's views of jobs over an open `App`: pages of a view and counts that never mislead.

The dashboard's jobs page, overview and failures page and `jobbus jobs list` / `jobbus status` read
jobs and numbers through these functions, so they show the same jobs and agree about the same moment.
A count is exact when at most `COUNT_CAP` jobs match (read along an index at request time); past that,
it is the planner's estimate of the same jobs, never less than what was read, and says so
(`Count.estimated`: shown with ≈, `"estimated": true` in JSON).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from jobbus.audit import acting
from jobbus.models import Job
from jobbus.requests import new_job_id
from jobbus.store.dashboard import DashboardStore, FailureGroup
from jobbus.store.statements import Chain, Operation, Statement, run_async, run_read_async
from jobbus.store.views import COUNT_CAP, FINISHED, VIEWS, Count, Cursor, Filters, JobSummary, Page, ViewStore

if TYPE_CHECKING:
    from jobbus.app import App

__all__ = [
    "COUNT_CAP",
    "VIEWS",
    "Count",
    "Cursor",
    "Filters",
    "Page",
    "SearchStopped",
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


class SearchStopped(Exception):
    """A search that tests each job of its view stopped after the seconds it was given: it takes seconds per
    million jobs walked (`jobbus search-index create` builds the index of finished jobs)."""


#: A search's count is exact up to this many matches, then "more than" it: reading 10,000 matches of a
#: common text spread over millions of jobs took longer than a page may.
SEARCH_COUNT_CAP = 1_000
#: How long a search may read the search index before its text counts as frequent: a text held by
#: millions of jobs makes the index return them all before the newest can be picked, while the view's
#: walk in its own order meets a page of them at once. Measured at 10 million jobs: a rare text 25 ms
#: through the index, a text of every other job 12.7 s through it and 20 ms walking.
INDEX_FIRST_SECONDS = 0.1
#: A walk that meets its answer within this long after the index read ran out makes the text frequent.
FREQUENT_WALK_SECONDS = 1.0
#: Texts found frequent lately in a view (database, schema, view, text) -> when, so that a page's count and
#: the pages after it walk at once instead of trying the index again.
_frequent: dict[tuple[str, str, str, str], float] = {}
_FREQUENT_FOR_SECONDS = 300.0
_FREQUENT_KEPT = 256


async def page(
    app: App,
    view: str,
    filters: Filters = ANY,
    *,
    cursor: Cursor | None = None,
    limit: int = 50,
    search_seconds: float | None = None,
) -> Page:
    """One page of `view` in its order, from `cursor` (`Page.next` of the page before).

    A search reads the search index first where it exists (for `INDEX_FIRST_SECONDS`), else walks the
    view testing each job: that walk stops after `search_seconds` when given, raising `SearchStopped`;
    without a bound it runs to its end.
    """
    store = _store(app.settings.schema)

    def statement(indexed: bool) -> Statement[Page]:
        return store.page(view, filters, cursor=cursor, limit=limit, search_index=indexed)

    if not filters.text:
        return await _run(app, statement(False))

    async def walk() -> Page:
        try:
            if _windowed(view, filters):
                return await _walk_finished(app, view, filters, cursor, limit, search_seconds)
            return await _run(app, statement(False), seconds=search_seconds)
        except psycopg.errors.QueryCanceled as exc:
            if search_seconds is None:
                raise
            raise SearchStopped(f"the search stopped after {search_seconds:g} s testing each job of {view}") from exc

    return await _searched(app, view, filters, statement(True), walk)


def _windowed(view: str, filters: Filters) -> bool:
    """Whether a search walks its view window by window: finished jobs along their triples (a name or a
    group has an index of its own)."""
    return view in (*FINISHED, "finished") and filters.name is None and filters.group_id is None


#: The first window of finish times a search walks (then each window four times the one before).
FIRST_WINDOW = timedelta(minutes=1)
_LAST = uuid.UUID(int=(1 << 128) - 1)


@dataclass(frozen=True, slots=True)
class _Window:
    #: The search's filters narrowed to the jobs finished after the window's start.
    filters: Filters
    #: The cursor of the window's end (None: from the newest), and the seconds the search has left.
    upper: Cursor | None
    seconds: float | None


async def _windows(app: App, filters: Filters, cursor: Cursor | None, seconds: float | None) -> AsyncIterator[_Window]:
    """The windows of finish times a search of finished jobs walks, newest first: a minute before the
    newest finish (and anything finished since), then each four times longer, down to the oldest
    finish. A text held by the jobs of some (status, queue, type) triples only is met among the newest,
    where one walk would first follow each triple without it to its end (226 s for a type's name among
    10 million jobs). Past `seconds` the next window raises QueryCanceled."""
    deadline = None if seconds is None else time.monotonic() + seconds
    oldest, newest = await _run(app, _store(app.settings.schema).finished_span())
    if oldest is None or newest is None:
        return
    # From the newest finish, not from now: after a quiet hour, windows from now would have grown past
    # the size of a page of matches before reaching a job.
    top = cursor.at if cursor is not None and cursor.at is not None else newest
    upper, window, floor = cursor, FIRST_WINDOW, filters.finished_after
    while True:
        lower = top - window if floor is None else max(top - window, floor)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise psycopg.errors.QueryCanceled("the search's time is up")
        yield _Window(replace(filters, finished_after=lower), upper, left)
        if lower < oldest or lower == floor:
            return
        top, upper, window = lower, Cursor(_LAST, lower), window * 4


async def _walk_finished(
    app: App, view: str, filters: Filters, cursor: Cursor | None, limit: int, seconds: float | None
) -> Page:
    """A page of a search of finished jobs, its windows walked in turn until it is full."""
    store = _store(app.settings.schema)
    found: list[JobSummary] = []
    async for window in _windows(app, filters, cursor, seconds):
        ask = store.page(view, window.filters, cursor=window.upper, limit=limit + 1 - len(found))
        found += (await _run(app, ask, seconds=window.seconds)).jobs
        if len(found) > limit:
            return Page(found[:limit], Cursor(found[limit - 1].id, found[limit - 1].finished_at))
    return Page(found, None)


async def _count_finished(app: App, view: str, filters: Filters, cap: int, seconds: float | None) -> tuple[int, bool]:
    """A search's count of finished jobs over ever longer windows from the newest, until it passes `cap`
    or covers every job (each window counts again what the ones before did: a third more in all)."""
    store = _store(app.settings.schema)
    read = (0, False)
    async for window in _windows(app, filters, None, seconds):
        read = await _run(app, store.count(view, window.filters, cap=cap), seconds=window.seconds)
        if read[1]:
            break
    return read


async def count(
    app: App, view: str, filters: Filters = ANY, *, cap: int = COUNT_CAP, search_seconds: float | None = None
) -> Count:
    """How many jobs of `view` match `filters`: exact up to `cap`, else the planner's estimate. A search
    counts up to `SEARCH_COUNT_CAP` and then says only "more" (the planner has no estimate of a text's
    matches); it is not counted (`Count.counted` false) when it walks the view past `search_seconds`."""
    store = _store(app.settings.schema)
    if not filters.text:
        read = await _run(app, store.count(view, filters, cap=cap))
    else:
        cap = min(cap, SEARCH_COUNT_CAP)

        async def walk() -> tuple[int, bool]:
            if _windowed(view, filters):
                return await _count_finished(app, view, filters, cap, search_seconds)
            return await _run(app, store.count(view, filters, cap=cap), seconds=search_seconds)

        try:
            read = await _searched(app, view, filters, store.count(view, filters, cap=cap, search_index=True), walk)
        except psycopg.errors.QueryCanceled:
            if search_seconds is None:
                raise
            return Count(0, counted=False)
    value, past_cap = read
    if not past_cap:
        return Count(value)
    if filters.text:
        return Count(value, at_least=True)
    return Count.estimate(value, await _run(app, store.estimate(view, filters)))


async def _searched(
    app: App, view: str, filters: Filters, indexed: Statement[_T], walk: Callable[[], Awaitable[_T]]
) -> _T:
    """A search's read through the search index within `INDEX_FIRST_SECONDS`, else `walk`. A text whose
    index read ran out and whose walk then met its answer within `FREQUENT_WALK_SECONDS` is frequent:
    remembered, so that the searches of it that follow walk at once. A slower walk says the index read
    was only slow (pages not yet in memory), so the next search tries the index again."""
    assert filters.text is not None
    key = (app.dsn, app.settings.schema, view, filters.text.lower())
    tried = False
    if time.monotonic() - _frequent.get(key, -_FREQUENT_FOR_SECONDS) >= _FREQUENT_FOR_SECONDS and (
        await search_indexed(app, view, filters)
    ):
        try:
            return await _run(app, indexed, seconds=INDEX_FIRST_SECONDS)
        except psycopg.errors.QueryCanceled:
            tried = True
    started = time.monotonic()
    found = await walk()
    if tried and time.monotonic() - started <= FREQUENT_WALK_SECONDS:
        if len(_frequent) >= _FREQUENT_KEPT:
            _frequent.pop(next(iter(_frequent)))
        _frequent[key] = time.monotonic()
    return found


async def search_indexed(app: App, view: str, filters: Filters) -> bool:
    """Whether a search of `view` can use the search index: it searches one finished status, whose index
    exists and is valid (one catalog read, only for a search)."""
    if not filters.text or view not in FINISHED:
        return False
    return f"job_search_{view}_idx" in await _run(app, _store(app.settings.schema).search_indexes())


async def counts(
    app: App, filters: Filters = ANY, *, views: tuple[str, ...] = TABS, search_seconds: float | None = None
) -> dict[str, Count]:
    """The count of each of `views` under the same filters (the jobs page's tabs), read side by side."""
    read = await asyncio.gather(*(count(app, view, filters, search_seconds=search_seconds) for view in views))
    return dict(zip(views, read, strict=True))


#: The name field suggests the names of this many of the tab's latest jobs of the chosen type.
NAME_SUGGESTIONS_FROM = 500


async def names(app: App, view: str, filters: Filters) -> list[str]:
    """The names (a Django task's import path) among the first `NAME_SUGGESTIONS_FROM` jobs of `view` in
    its order under `filters`' queues and types, sorted: suggestions for the name field, which filters
    by any name; none until a type is chosen. Every distinct name would need an index of (type, name)
    that each job pays for."""
    if not filters.types:
        return []
    latest = await page(app, view, replace(filters, name=None, text=None), limit=NAME_SUGGESTIONS_FROM)
    return sorted({job.name for job in latest.jobs if job.name})


async def pairs(app: App, view: str) -> list[tuple[str, str]]:
    """Every (queue, type) pair of `view`'s jobs: the choices of its filters."""
    return await _run(app, _store(app.settings.schema).pairs(view))


async def jobs_of(app: App, page: Page) -> list[Job]:
    """The jobs of a page read whole (every column, the configuration and result included), in its order."""
    return await _run(app, app.store.find_jobs([job.id for job in page.jobs]))


def order_of(view: str, filters: Filters = ANY) -> tuple[Callable[[Job], tuple[Any, ...]], bool]:
    """The sort key of `view`'s order and whether it runs from the largest key (the order `page` reads
    in), so that pages of several cells (SPEC 23) merge into the one order."""
    if filters.group_id is not None:
        return (lambda job: (job.id,)), True
    if view in (*FINISHED, "finished"):
        return (lambda job: (job.finished_at, job.id)), True
    if view == "running":
        return (lambda job: (job.started_at, job.id)), True
    return (lambda job: (job.available_at, job.id)), False


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
    parts = await asyncio.gather(_run(app, store.queue_counts("queued")), _run(app, store.queue_counts("finished")))
    for queue, what, n, past_cap in parts[0] + parts[1]:
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
    who, entry_id = acting(), new_job_id()
    while True:
        batch = app.store.retry_failure_group(pattern, skip=kept)

        def then(
            result: tuple[int, int, list[uuid.UUID]], retried: int = retried, kept: int = len(kept)
        ) -> Operation[None] | None:
            """The one audit entry of the group's retry, in the transaction of its last batch (none chosen)."""
            if result[0]:
                return None
            details = {"count": retried, "kept": kept, "filter": {"error_group": pattern}}
            return app.audit_store.record("retry", "jobs", details, who=who, entry_id=entry_id)

        async with app.pool.connection() as conn, conn.transaction():
            await conn.execute(b"SET LOCAL jit = off")  # as run_read_async reads: see its docstring
            chosen, done, left = await run_async(conn, Chain(batch, then))
        retried += done
        kept += left
        if chosen == 0:
            return retried, len(kept)


@cache
def _store(schema: str) -> ViewStore:
    return ViewStore(schema)


async def _run(app: App, statement: Statement[_T], *, seconds: float | None = None) -> _T:
    async with app.pool.connection() as conn:
        return await run_read_async(conn, statement, seconds=seconds)
