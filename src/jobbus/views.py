"""The operator's views of jobs over an open `App`: pages of a view and counts that never mislead.

The dashboard's jobs page, overview and failures page and `jobbus jobs list` / `jobbus status` read
jobs and numbers through these functions, so they show the same jobs and agree about the same moment.
A count is exact when at most `COUNT_CAP` jobs match (read along an index at request time); past that,
it is the planner's estimate of the same jobs, never less than what was read, and says so
(`Count.estimated`: shown with ≈, `"estimated": true` in JSON).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, TypeVar

from jobbus.store.statements import Statement, run_async
from jobbus.store.views import COUNT_CAP, VIEWS, Count, Cursor, Filters, Page, ViewStore

if TYPE_CHECKING:
    from jobbus.app import App

__all__ = ["COUNT_CAP", "VIEWS", "Count", "Cursor", "Filters", "Page", "count", "counts", "page"]

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
    estimate = await _run(app, store.estimate(view, filters))
    return Count(max(estimate, value), estimated=True)


async def counts(app: App, filters: Filters = ANY, *, views: tuple[str, ...] = TABS) -> dict[str, Count]:
    """The count of each of `views` under the same filters (the jobs page's tabs)."""
    return {view: await count(app, view, filters) for view in views}


@cache
def _store(schema: str) -> ViewStore:
    return ViewStore(schema)


async def _run(app: App, statement: Statement[_T]) -> _T:
    async with app.pool.connection() as conn:
        return await run_async(conn, statement)
