"""The dashboard's pages: each a function of the dashboard and the request that reads what it shows and
renders its template (`web.page` puts the token check and the security headers around it)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from jobbus import control, views
from jobbus.dashboard import formatting
from jobbus.dashboard.actions import WORKER_ACTIONS
from jobbus.dashboard.charts import RANGES
from jobbus.dashboard.security import root_of
from jobbus.dashboard.state import Dashboard
from jobbus.dashboard.workflow import step_views, waiting_reason
from jobbus.errors import InvalidJobError
from jobbus.joblog import history_logs
from jobbus.models import TRACE_KEY, JobStatus
from jobbus.requests import validate_tags
from jobbus.store.control import ControlStore
from jobbus.store.dashboard import FAMILY_LIMIT, WINDOW
from jobbus.store.views import Count

PAGE_SIZE = 50
STATUSES = ("queued", "running", "completed", "failed", "cancelled")
#: The tabs of the jobs page, the first one shown when none is asked for.
TABS = views.TABS
#: How long a search without the search index may look for a page of matches, and then for each tab's
#: count: it tests each job of the view, several seconds per million (docs/dashboard.md).
SEARCH_SECONDS = 3.0
SEARCH_COUNT_SECONDS = 0.5


async def queue_rows(dash: Dashboard) -> list[views.QueueStatus]:
    """The queue table, read now as `jobbus status` reads it (exact, or estimates that say so)."""
    pauses = await dash.run(ControlStore(dash.app.settings.schema).pause_targets())
    limited = [q.queue for q in await dash.app.list_queues()]
    paused = [p.target for p in pauses if p.kind == "queue"]
    return await views.queue_table(dash.app, paused=paused, also=limited)


async def overview(dash: Dashboard, request: Request) -> Response:
    range_ = RANGES.get(request.query_params.get("range") or "1h")
    if range_ is None:
        raise HTTPException(400, f"unknown range: choose one of {', '.join(RANGES)}")
    # Read side by side, each on a connection of its own: the page waits for the slowest read.
    (queues, series, age, workers, estimate), (unhandled, range_totals) = await asyncio.gather(
        asyncio.gather(
            queue_rows(dash),
            dash.run(dash.store.series(width=range_.step, buckets=range_.buckets)),
            dash.run(dash.store.sample_age()),
            control.list_workers(dash.app, forget_after=None),
            dash.run(dash.store.estimated_jobs()),
        ),
        asyncio.gather(_unhandled(dash), _finished_in(dash, range_.seconds)),
    )
    return dash.render(
        request,
        "overview.html",
        queues=queues,
        charts=formatting.charts(series, range_),
        chart_range=range_,
        ranges=RANGES.values(),
        range_totals=range_totals,
        range_sampled=formatting.range_totals(series, range_),
        workers=control.summarize_workers(workers),
        leader=next((w.id for w in workers if w.leader), None),
        estimate=estimate,
        unhandled=unhandled,
        totals={name: Count.total(getattr(q, name) for q in queues) for name in ("available", "scheduled", "running")},
        sample_age=age,
        stale=age is None or age > 3 * dash.app.settings.stats_interval_seconds,
    )


async def _unhandled(dash: Dashboard) -> list[tuple[control.UnhandledWork, Count]]:
    """Each (queue, type) of queued jobs no live worker takes, with how many wait there."""
    found = await control.unhandled_work(dash.app, cap=1)
    counts = await asyncio.gather(
        *(views.count(dash.app, "queued", views.Filters((u.queue,), (u.type,))) for u in found)
    )
    return list(zip(found, counts, strict=True))


async def _finished_in(dash: Dashboard, seconds: float) -> dict[str, Count]:
    """The jobs finished in the last `seconds`, by outcome, counted now as every count is."""
    since = views.Filters(finished_after=datetime.now(UTC) - timedelta(seconds=seconds))
    counts = await views.counts(dash.app, since, views=("completed", "failed", "cancelled"))
    return {"processed": Count.total((counts["completed"], counts["failed"])), **counts}


async def jobs(dash: Dashboard, request: Request) -> Response:
    """One tab (a status or a view of queued jobs) of every job, in its order, filtered, page after page:
    the tab's jobs all, never a window of them; each tab with its count under the same filters (a
    search's counts read after the page, from `job_counts`)."""
    params = request.query_params
    status, shown, filters = _jobs_filters(params)
    cursor = views.Cursor.decode(params["after"]) if params.get("after") else None
    text = filters.text
    searched_id = formatting.parse_uuid(text)
    if searched_id is not None and await dash.run(dash.store.job(searched_id)) is not None:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/jobs/{searched_id}", status_code=303)
    if searched_id is not None and (holder := await dash.elsewhere(searched_id)) is not None:
        return RedirectResponse(_in_cell(request, holder, f"/jobs/{searched_id}"), status_code=303)
    # The list first, on its own: a search's read of the search index has its 0.1 s alone. Then the
    # rest side by side, each on a connection of its own. A search's counts test the text on the jobs of
    # each tab: the page asks for them once it is shown (`job_counts`), so that it waits for its list only.
    job_page, search_stopped = await _page_of(dash, status, filters, cursor)
    counts, indexed, pairs, name_choices = await asyncio.gather(
        views.counts(dash.app, filters) if text is None else _counted_later(),
        views.search_indexed(dash.app, status, filters),
        views.pairs(dash.app, status),
        views.names(dash.app, status, filters),
    )
    query = {k: v for k, v in shown.items() if v}
    next_url = "/jobs?" + urlencode({**query, "after": job_page.next.encode()}) if job_page.next else None
    if text is not None and cursor is None and not search_stopped and job_page.next is None:
        counts[status] = Count(len(job_page.jobs))  # the whole search fit on this page
    tab_query = {k: v for k, v in query.items() if k not in ("status", "group")}
    return dash.render(
        request,
        "jobs.html",
        counts=counts,
        counts_url="/jobs/counts?" + urlencode({k: v for k, v in query.items() if k != "status"}),
        count_cap=views.COUNT_CAP,
        unindexed_search=bool(text) and not indexed,
        search_stopped=search_stopped,
        search_seconds=SEARCH_SECONDS,
        tabs=TABS,
        tab_base="/jobs?" + urlencode(tab_query) + ("&" if tab_query else ""),
        page_jobs=job_page.jobs,
        next_url=next_url,
        first_url="/jobs?" + urlencode(query) if cursor else None,
        filters=shown,
        statuses=views.VIEWS,
        queue_choices=sorted({q for q, t in pairs if not shown["type"] or t == shown["type"]}),
        type_choices=sorted({t for q, t in pairs if not shown["queue"] or q == shown["queue"]}),
        name_choices=name_choices,
        previews={
            job.id: formatting.preview(
                dash.redact,
                dash.payload(job.id, job.type, "configuration", job.configuration),
                job.configuration_bytes,
            )
            for job in job_page.jobs
        },
        self_url=request.url.path[len(request.scope.get("root_path", "")) :]
        + (f"?{request.url.query}" if request.url.query else ""),
        redact=dash.redact,
    )


def _in_cell(request: Request, dash: Dashboard, path: str) -> str:
    """The address of `path` among the pages of `dash`'s cell."""
    return f"{root_of(request)}{dash.prefix}{path}"


def _jobs_filters(params: QueryParams) -> tuple[str, dict[str, str], views.Filters]:
    """The jobs page's tab, its filters as the form shows them, and as the views read them."""
    status = params.get("status") or TABS[0]
    if status not in views.VIEWS:
        raise HTTPException(400, f"unknown status {status!r}: one of {', '.join(views.VIEWS)}")
    group = formatting.parse_uuid(params.get("group"))
    shown = {
        "status": status,
        "queue": params.get("queue") or "",
        "type": params.get("type") or "",
        "name": params.get("name") or "",
        "group": str(group) if group else "",
        "q": params.get("q") or "",
        "tag": params.get("tag") or "",
    }
    tags = tag_list(shown["tag"])
    shown["tag"] = ", ".join(tags)
    filters = views.Filters(
        (shown["queue"],) if shown["queue"] else (),
        (shown["type"],) if shown["type"] else (),
        shown["name"] or None,
        shown["q"].strip()[:200] or None,
        group,
        tags=tags,
    )
    return status, shown, filters


def tag_list(text: str) -> tuple[str, ...]:
    """The tags of the tag field (several separated by commas: jobs with every one), validated as a
    job's; a bad one is a 400 naming the problem."""
    try:
        return validate_tags("tag", [t.strip() for t in text.split(",") if t.strip()]) or ()
    except InvalidJobError as exc:
        raise HTTPException(400, str(exc)) from None


async def _counted_later() -> dict[str, Count]:
    return {}


async def job_counts(dash: Dashboard, request: Request) -> Response:
    """Each tab's count under the jobs page's filters, as JSON: what a search's page shows once it is
    loaded. A search's count that walks its tab past `SEARCH_COUNT_SECONDS` is not counted."""
    _status, _shown, filters = _jobs_filters(request.query_params)
    counts = await views.counts(dash.app, filters, search_seconds=SEARCH_COUNT_SECONDS)
    return JSONResponse({tab: {"text": formatting.count(c), "title": _count_title(c)} for tab, c in counts.items()})


def _count_title(count: Count) -> str:
    """What a tab's count says of itself when hovered (as jobs.html writes it)."""
    if not count.counted:
        return "not counted: this search tests each job of the tab it meets, and took longer than a page may"
    if count.estimated:
        return f"estimated by PostgreSQL's planner: more than {views.COUNT_CAP:,} jobs"
    return ""


async def _page_of(
    dash: Dashboard, status: str, filters: views.Filters, cursor: views.Cursor | None
) -> tuple[views.Page, bool]:
    """The page of the jobs tab, and whether its search stopped at `SEARCH_SECONDS` (then no jobs)."""
    try:
        return await views.page(
            dash.app, status, filters, cursor=cursor, limit=PAGE_SIZE, search_seconds=SEARCH_SECONDS
        ), False
    except views.SearchStopped:
        return views.Page([], None), True


async def job_detail(dash: Dashboard, request: Request) -> Response:
    raw_id = request.path_params["job_id"]
    job_id = formatting.parse_uuid(raw_id)
    if job_id is None:
        raise HTTPException(404, f"{raw_id[:80]!r} is not a job id: a job id is a UUID")
    after = formatting.parse_uuid(request.query_params.get("children_after"))
    found = await dash.run(dash.store.job(job_id))
    steps = await dash.run(dash.store.job_steps(job_id))
    children = await dash.run(dash.store.job_children(job_id, after=after))
    if found is None:
        if (holder := await dash.elsewhere(job_id)) is not None:  # over cells: the cell that holds it
            query = f"?{request.url.query}" if request.url.query else ""
            return RedirectResponse(_in_cell(request, holder, f"/jobs/{job_id}{query}"), status_code=303)
        raise HTTPException(404, f"no job has the id {job_id}: it may have been deleted, or pruned by retention")
    job = found.job
    execution = dash.payload(job.id, job.type, "execution", job.execution_data)
    if isinstance(execution, dict):
        execution = {k: v for k, v in execution.items() if k != TRACE_KEY}
    fields = {
        "configuration": dash.redact(
            "configuration", dash.payload(job.id, job.type, "configuration", job.configuration_data)
        ),
        "execution_data": dash.redact("execution_data", execution),
        "result": dash.redact("result", dash.payload(job.id, job.type, "result", job.result)),
        "last_error": dash.redact("last_error", job.last_error),
    }
    by_name = {row.name: row for row in steps.rows}
    parked = job.status is JobStatus.QUEUED and bool(job.history)
    history = [
        {
            **entry,
            "error": dash.redact("last_error", entry.get("error")),
            "traceback": dash.redact("traceback", entry["traceback"]) if entry.get("traceback") else None,
            "logs": dash.redact("logs", history_logs(entry)),
            "reason": waiting_reason(
                entry, current=parked and n == len(job.history) - 1, job=job, steps=by_name, active=children.active
            ),
        }
        for n, entry in enumerate(job.history)
        if isinstance(entry, dict)
    ]
    results = dash.redact(
        "steps", {row.name: dash.payload(job.id, job.type, f"step:{row.name}", row.result) for row in steps.rows}
    )
    return dash.render(
        request,
        "job.html",
        job=job,
        parent=found,
        fields=fields,
        history=history,
        steps=step_views(steps.rows, results, datetime.now(UTC)),
        steps_total=steps.total,
        children=children,
        children_after=after,
        children_next=children.rows[-1].id if children.total > len(children.rows) else None,
        page_size=FAMILY_LIMIT,
        window=WINDOW,
        trace=job.execution_data.get(TRACE_KEY),
        progress=formatting.progress(job.progress_current, job.progress_total),
    )


async def failures(dash: Dashboard, request: Request) -> Response:
    """Every failure group over every failed job, counted as the views count."""
    groups = await views.failure_groups(dash.app)
    total = await views.count(dash.app, "failed")
    return dash.render(request, "failures.html", groups=groups, total=total, redact=dash.redact)


async def workers(dash: Dashboard, request: Request) -> Response:
    registry = await control.list_workers(dash.app, forget_after=None)
    commands = await dash.run(dash.store.commands())
    selected = request.query_params.get("worker")
    running = await dash.run(dash.store.running_of_worker(selected)) if selected else []
    return dash.render(
        request,
        "workers.html",
        workers=registry,
        commands=commands,
        selected=selected,
        running=running,
        actions=WORKER_ACTIONS,
    )


async def queues(dash: Dashboard, request: Request) -> Response:
    rows = await queue_rows(dash)
    limits = {q.queue: q for q in await dash.app.list_queues()}
    return dash.render(request, "queues.html", queues=rows, limits=limits)


async def periodic(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "periodic.html", periodics=await dash.app.list_periodic())


async def groups(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "groups.html", groups=await dash.run(dash.store.recent_groups()))


async def group_detail(dash: Dashboard, request: Request) -> Response:
    group = formatting.parse_uuid(request.path_params["group_id"])
    if group is None:
        raise HTTPException(404, "no such group")
    progress = await dash.app.group_progress(group)
    return dash.render(request, "group.html", group=group, progress=progress)


#: Entries of the audit trail per page.
AUDIT_PAGE = 50


async def audit(dash: Dashboard, request: Request) -> Response:
    """The audit trail, newest first, a page after another (keyset on the last entry's time and id: one
    index range scan whatever the trail's length)."""
    after = _audit_cursor(request.query_params.get("after"))
    found = await dash.run(dash.app.audit_store.entries(before=after, limit=AUDIT_PAGE + 1))
    entries, more = found[:AUDIT_PAGE], len(found) > AUDIT_PAGE
    last = entries[-1] if entries else None
    next_url = "/audit?" + urlencode({"after": f"{last.at.isoformat()}|{last.id}"}) if more and last else None
    return dash.render(request, "audit.html", entries=entries, next_url=next_url, first_url="/audit" if after else None)


def _audit_cursor(text: str | None) -> tuple[datetime, uuid.UUID] | None:
    """The `after` of an Audit page's link: the last entry's time and id; anything else is a 400."""
    if not text:
        return None
    at, _, ident = text.partition("|")
    entry_id = formatting.parse_uuid(ident)
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        moment = None
    if entry_id is None or moment is None or moment.tzinfo is None:
        raise HTTPException(400, "not a page of the audit trail")
    return moment, entry_id
