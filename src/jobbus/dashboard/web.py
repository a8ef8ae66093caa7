"""The dashboard's pages and actions: a Starlette application rendered with Jinja2."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobbus import control
from jobbus.dashboard.charts import RANGES, Range, line_chart
from jobbus.dashboard.live import LiveUpdates
from jobbus.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    Guard,
    HostGuard,
    Redactor,
    redact_secrets,
)
from jobbus.dashboard.workflow import parked_without_deadline, step_views, waiting_reason
from jobbus.errors import InvalidJobError, InvalidStateError
from jobbus.limits import KEEP, Keep, RateLimit
from jobbus.models import JOB_VIEWS, TRACE_KEY, JobStatus
from jobbus.store.dashboard import (
    COUNT_CAP,
    FAMILY_LIMIT,
    WINDOW,
    Children,
    Cursor,
    DashboardStore,
    JobPageRow,
    QueueRow,
    Series,
    Steps,
)
from jobbus.store.statements import Statement, run_async

if TYPE_CHECKING:
    from jobbus.app import App

T = TypeVar("T")
PAGE_SIZE = 50
#: A bulk action acts on at most this many jobs per click (a failure group says how many are left).
BULK_LIMIT = 1000
STATUSES = ("queued", "running", "completed", "failed", "cancelled")
#: The views of queued jobs the jobs page offers beside the statuses (jobbus.models.JOB_VIEWS).
VIEWS = JOB_VIEWS
WORKER_ACTIONS = ("pause", "resume", "drain", "stop", "restart")
FLASH_COOKIE = "jobbus_flash"
#: What reading a job's workflow raises on a schema without migration 0010's tables (or 0014's column).
BEFORE_WORKFLOWS = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
#: No framing (a page of buttons in someone else's frame is a clickjacking target), no script or style
#: from anywhere but this dashboard, no referrer leaving it.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def _package_dir(name: str) -> str:
    return str(Path(str(resources.files("jobbus.dashboard").joinpath(name))))


class Dashboard:
    """State shared by the requests of one dashboard process."""

    def __init__(self, app: App, *, read_only: bool, token: str | None, redact: Redactor | None) -> None:
        self.app = app
        self.guard = Guard(token, read_only=read_only)
        self.redact = redact if redact is not None else redact_secrets
        self.store = DashboardStore(app.settings.schema)
        self.templates = Environment(
            loader=FileSystemLoader(_package_dir("templates")),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["ago"] = _ago
        self.templates.filters["seconds"] = _seconds
        self.templates.filters["count"] = _count
        self.templates.filters["when"] = _when
        self.templates.filters["pretty"] = _pretty
        self.templates.filters["shortid"] = _short_id
        self.templates.filters["parked_without_deadline"] = parked_without_deadline
        self._opened = False
        self._open_lock = asyncio.Lock()
        self.live = LiveUpdates(
            pulse=lambda: self.run(self.store.pulse()),
            listen_dsn=app.settings.notification_dsn,
            job_channel=app.store.channel,
            control_channel=app.store.control_channel,
        )

    async def ensure_open(self) -> None:
        """Open the App's pool on first use (a mounted sub-application gets no lifespan of its own)."""
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await self.app.open()
                    self._opened = True

    async def close(self) -> None:
        await self.live.close()
        if self._opened:
            self._opened = False
            await self.app.close()

    async def run(self, statement: Statement[T]) -> T:
        await self.ensure_open()
        async with self.app.pool.connection() as conn:
            return await run_async(conn, statement)

    # -- rendering ----------------------------------------------------------------------------------

    def render(self, request: Request, template: str, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "")
        flash = request.cookies.get(FLASH_COOKIE)
        html = self.templates.get_template(template).render(
            request=request,
            base=base,
            path=request.url.path[len(base) :] or "/",
            csrf=self.guard.csrf_token(request),
            csrf_field=CSRF_FIELD,
            read_only=self.guard.read_only,
            token_required=self.guard.token is not None,
            flash=flash,
            page=template.removesuffix(".html"),
            fragment=request.headers.get("x-jobbus-fragment") == "1",
            **context,
        )
        response = HTMLResponse(html)
        if flash:
            response.delete_cookie(FLASH_COOKIE, path=base or "/")
        return response


def create_starlette(
    app: App,
    *,
    read_only: bool = False,
    token: str | None = None,
    redact: Redactor | None = None,
    allowed_hosts: Sequence[str] | None = None,
    host_auth: bool = False,
) -> Starlette:
    dash = Dashboard(app, read_only=read_only, token=token, redact=redact)

    def page(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not dash.guard.authenticated(request):
                if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                    base = request.scope.get("root_path", "")
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"{base}/login?{urlencode({'next': target})}", status_code=303)
                return PlainTextResponse("authentication required", status_code=401)
            await dash.ensure_open()
            response = await handler(request)
            _set_csrf_cookie(request, response)
            response.headers.setdefault("cache-control", "no-store")
            response.headers.update(SECURITY_HEADERS)
            return response

        return endpoint

    def action(
        handler: Callable[[Request, dict[str, Any]], Awaitable[str]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if dash.guard.read_only:
                return PlainTextResponse("this dashboard is read-only", status_code=403)
            form = await request.form()
            fields: dict[str, Any] = {key: form.getlist(key) if key == "ids" else form.get(key) for key in form}
            submitted = fields.get(CSRF_FIELD)
            if not dash.guard.csrf_ok(request, submitted if isinstance(submitted, str) else None):
                return PlainTextResponse("missing or wrong CSRF token: reload the page and try again", status_code=403)
            try:
                message = await handler(request, fields)
            except (InvalidStateError, InvalidJobError, ValueError) as exc:
                message = f"refused: {exc}"
            base = request.scope.get("root_path", "")
            back = _safe_next(fields.get("next")) or "/"
            response = RedirectResponse(base + back, status_code=303)
            response.set_cookie(FLASH_COOKIE, message[:300], httponly=True, samesite="strict", path=base or "/")
            return response

        return page(endpoint)

    # -- pages --------------------------------------------------------------------------------------

    async def queue_rows(request: Request) -> tuple[list[QueueRow], dict[str, Any]]:
        """The queue table: the leader's latest sample, or, when it is older than three sampling
        intervals (no leader: no worker runs), counts read now (bounded) and said to be so."""
        age = await dash.run(dash.store.sample_age())
        stale = age is None or age > 3 * dash.app.settings.stats_interval_seconds
        rows = await dash.run(dash.store.counts_now() if stale else dash.store.latest_sample())
        return rows, {"stale": stale, "sample_age": age, "cap": COUNT_CAP}

    async def overview(request: Request) -> Response:
        range_ = RANGES.get(request.query_params.get("range") or "1h")
        if range_ is None:
            raise HTTPException(400, f"unknown range: choose one of {', '.join(RANGES)}")
        queues, freshness = await queue_rows(request)
        series = await dash.run(dash.store.series(width=range_.step, buckets=range_.buckets))
        workers = await control.list_workers(dash.app, forget_after=None)
        estimate = await dash.run(dash.store.estimated_jobs())
        unhandled = await control.unhandled_work(dash.app, cap=COUNT_CAP)
        return dash.render(
            request,
            "overview.html",
            queues=queues,
            charts=_charts(series, range_),
            chart_range=range_,
            ranges=RANGES.values(),
            range_totals=_range_totals(series, range_),
            workers=control.summarize_workers(workers),
            leader=next((w.id for w in workers if w.leader), None),
            estimate=estimate,
            unhandled=unhandled,
            totals={
                "available": sum(q.available for q in queues),
                "scheduled": sum(q.scheduled for q in queues),
                "running": sum(q.running for q in queues),
            },
            sampled_at=max((q.sampled_at for q in queues if q.sampled_at), default=None),
            **freshness,
        )

    async def jobs(request: Request) -> Response:
        params = request.query_params
        status = params.get("status") or None
        if status not in (None, *STATUSES, *VIEWS, "finished"):
            raise HTTPException(400, f"unknown status {status!r}: one of {', '.join((*STATUSES, *VIEWS, 'finished'))}")
        group = _parse_uuid(params.get("group"))
        cursor = Cursor.decode(params["after"]) if params.get("after") else None
        filters = {
            "status": status or "",
            "queue": params.get("queue") or "",
            "type": params.get("type") or "",
            "group": str(group) if group else "",
            "q": params.get("q") or "",
        }
        text = (params.get("q") or "").strip() or None
        job_page = await dash.run(
            dash.store.list_jobs(
                status=status,
                queue=filters["queue"] or None,
                type=filters["type"] or None,
                group_id=group,
                text=text[:200] if text else None,
                cursor=cursor,
                limit=PAGE_SIZE,
            )
        )
        query = {k: v for k, v in filters.items() if v}
        next_url = None
        if job_page.next is not None:
            next_url = "/jobs?" + urlencode({**query, "after": job_page.next.encode()})
        counts = await dash.run(dash.store.job_counts(queue=filters["queue"] or None, type=filters["type"] or None))
        choices = await dash.run(dash.store.job_choices(status=status))
        tab_query = {k: v for k, v in query.items() if k not in ("status", "group", "q")}
        return dash.render(
            request,
            "jobs.html",
            counts=counts,
            views=VIEWS,
            tab_base="/jobs?" + urlencode(tab_query) + ("&" if tab_query else ""),
            page_jobs=job_page.jobs,
            next_url=next_url,
            first_url="/jobs?" + urlencode(query) if cursor else None,
            scanned=job_page.scanned,
            filters=filters,
            statuses=STATUSES,
            queue_choices=choices.queues(type=filters["type"] or None),
            type_choices=choices.types(queue=filters["queue"] or None),
            previews={
                job.id: _preview(dash.redact, job.configuration, job.configuration_bytes) for job in job_page.jobs
            },
            self_url=request.url.path[len(request.scope.get("root_path", "")) :]
            + (f"?{request.url.query}" if request.url.query else ""),
            redact=dash.redact,
        )

    async def job_detail(request: Request) -> Response:
        raw_id = request.path_params["job_id"]
        job_id = _parse_uuid(raw_id)
        if job_id is None:
            raise HTTPException(404, f"{raw_id[:80]!r} is not a job id: a job id is a UUID")
        after = _parse_uuid(request.query_params.get("children_after"))
        try:
            found = await dash.run(dash.store.job(job_id))
            steps = await dash.run(dash.store.job_steps(job_id))
            children = await dash.run(dash.store.job_children(job_id, after=after))
        except BEFORE_WORKFLOWS:  # a schema a migration behind (rolling deploy): no workflow to show
            legacy = await dash.app.find(job_id)
            found = JobPageRow(legacy, None, None) if legacy else None
            steps, children = Steps([], 0), Children([], 0, None)
        if found is None:
            raise HTTPException(404, f"no job has the id {job_id}: it may have been deleted, or pruned by retention")
        job = found.job
        execution = {k: v for k, v in job.execution_data.items() if k != TRACE_KEY}
        fields = {
            "configuration": dash.redact("configuration", job.configuration_data),
            "execution_data": dash.redact("execution_data", execution),
            "result": dash.redact("result", job.result),
            "last_error": dash.redact("last_error", job.last_error),
        }
        by_name = {row.name: row for row in steps.rows}
        parked = job.status is JobStatus.QUEUED and bool(job.history)
        history = [
            {
                **entry,
                "error": dash.redact("last_error", entry.get("error")),
                "traceback": dash.redact("traceback", entry["traceback"]) if entry.get("traceback") else None,
                "reason": waiting_reason(
                    entry, current=parked and n == len(job.history) - 1, job=job, steps=by_name, active=children.active
                ),
            }
            for n, entry in enumerate(job.history)
            if isinstance(entry, dict)
        ]
        results = dash.redact("steps", {row.name: row.result for row in steps.rows})
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
            progress=_progress(job.progress_current, job.progress_total),
        )

    async def failures(request: Request) -> Response:
        # No ids: the page shows none (its retry form names the group, and the action reads them), and
        # up to 1,000 per group were most of what the page's statement sent.
        groups = await dash.run(dash.store.failures(ids=0))
        return dash.render(request, "failures.html", groups=groups, redact=dash.redact)

    async def workers(request: Request) -> Response:
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

    async def queues(request: Request) -> Response:
        rows, freshness = await queue_rows(request)
        limits = {q.queue: q for q in await dash.app.list_queues()}
        return dash.render(request, "queues.html", queues=rows, limits=limits, **freshness)

    async def periodic(request: Request) -> Response:
        return dash.render(request, "periodic.html", periodics=await dash.app.list_periodic())

    async def groups(request: Request) -> Response:
        return dash.render(request, "groups.html", groups=await dash.run(dash.store.recent_groups()))

    async def group_detail(request: Request) -> Response:
        group = _parse_uuid(request.path_params["group_id"])
        if group is None:
            raise HTTPException(404, "no such group")
        progress = await dash.app.group_progress(group)
        return dash.render(request, "group.html", group=group, progress=progress)

    async def login(request: Request) -> Response:
        base = request.scope.get("root_path", "")
        target = _safe_next(request.query_params.get("next")) or "/"
        if request.method == "POST":
            form = await request.form()
            submitted = form.get(CSRF_FIELD)
            if not dash.guard.csrf_ok(request, submitted if isinstance(submitted, str) else None):
                return PlainTextResponse("missing or wrong CSRF token: reload the page and try again", status_code=403)
            token = form.get("token")
            target = _safe_next(form.get("next")) or "/"
            response: Response
            if dash.guard.login(token if isinstance(token, str) else ""):
                response = RedirectResponse(base + target, status_code=303)
                response.set_cookie(
                    SESSION_COOKIE,
                    dash.guard.session_value,
                    httponly=True,
                    samesite="strict",
                    secure=request.url.scheme == "https",
                    path=base or "/",
                )
                return response
            response = dash.render(request, "login.html", next=target, error="wrong token")
            response.status_code = 401
            _set_csrf_cookie(request, response)
            return response
        if dash.guard.token is None or dash.guard.authenticated(request):
            return RedirectResponse(base + target, status_code=303)
        response = dash.render(request, "login.html", next=target, error=None)
        _set_csrf_cookie(request, response)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def logout(request: Request) -> Response:
        base = request.scope.get("root_path", "")
        form = await request.form()
        submitted = form.get(CSRF_FIELD)
        if not dash.guard.csrf_ok(request, submitted if isinstance(submitted, str) else None):
            return PlainTextResponse("missing or wrong CSRF token: reload the page and try again", status_code=403)
        response = RedirectResponse(f"{base}/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=base or "/")
        return response

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            await dash.ensure_open()
            async for chunk in dash.live.events(request.is_disconnected):
                yield chunk

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    # -- actions ------------------------------------------------------------------------------------

    async def retry_job(request: Request, form: dict[str, Any]) -> str:
        job_id = _require_uuid(request.path_params["job_id"])
        await dash.app.retry(job_id)
        return f"job {job_id} queued again"

    async def cancel_job(request: Request, form: dict[str, Any]) -> str:
        job_id = _require_uuid(request.path_params["job_id"])
        status = await dash.app.cancel(job_id)
        return f"job {job_id}: {'cancellation requested' if status is JobStatus.RUNNING else status.value}"

    async def delete_job(request: Request, form: dict[str, Any]) -> str:
        job_id = _require_uuid(request.path_params["job_id"])
        await dash.app.delete(job_id)
        return f"job {job_id} deleted"

    async def run_job_now(request: Request, form: dict[str, Any]) -> str:
        job_id = _require_uuid(request.path_params["job_id"])
        await dash.app.run_now(job_id)
        return f"job {job_id} is available now"

    async def bulk_jobs(request: Request, form: dict[str, Any]) -> str:
        ids = [_require_uuid(i) for i in (form.get("ids") or [])][:BULK_LIMIT]
        verb = form.get("action")
        if verb not in BULK_ACTIONS:
            raise ValueError("bulk action must be retry, cancel or delete")
        if not ids:
            return "no job selected"
        done = await BULK_ACTIONS[verb](dash.app, ids)
        return f"{verb}: {done} of {len(ids)} selected job(s)"

    async def retry_failures(request: Request, form: dict[str, Any]) -> str:
        pattern = form.get("pattern")
        groups = await dash.run(dash.store.failures(limit=1000, ids=BULK_LIMIT))
        group = next((g for g in groups if g.key == pattern), None)
        if group is None:
            return "that failure group is gone (retried or pruned meanwhile)"
        done = await _retry_many(dash.app, group.ids)
        left = group.count - len(group.ids)
        return f"retried {done} job(s) failing with {group.example}" + (
            f"; {left} more: retry again" if left > 0 else ""
        )

    async def worker_action(request: Request, form: dict[str, Any]) -> str:
        verb = form.get("action")
        if verb not in WORKER_ACTIONS:
            raise ValueError(f"unknown action {verb!r}")
        worker_id = form.get("worker_id") or None
        target = control.Target.of(worker_id=worker_id, all=worker_id is None)
        issued = await control.issue(dash.app, verb, target)
        return f"{verb} sent to {target} (command {issued.generation}, {len(issued.worker_ids)} worker(s) addressed)"

    async def queue_action(request: Request, form: dict[str, Any]) -> str:
        queue = request.path_params["queue"]
        verb = request.path_params["verb"]
        if verb in ("pause", "resume"):
            issued = await control.issue(dash.app, verb, control.Target.of(queue=queue))
            return f"queue {queue}: {verb} (command {issued.generation})"
        if verb == "limits":
            limits = await dash.app.set_queue(
                queue,
                concurrency=_limit(form, "concurrency", _optional_int),
                concurrency_per_key=_limit(form, "concurrency_per_key", _optional_int),
                rate_limit=_limit(form, "rate_limit", _optional_rate),
                rate_limit_per_key=_limit(form, "rate_limit_per_key", _optional_rate),
            )
            shown = ", ".join(
                f"{name} {value}"
                for name, value in (
                    ("concurrency", limits.concurrency),
                    ("per key", limits.concurrency_per_key),
                    ("rate", limits.rate_limit),
                    ("rate per key", limits.rate_limit_per_key),
                )
                if value is not None
            )
            return f"queue {queue}: {shown or 'no limits'}"
        raise HTTPException(404)

    async def periodic_action(request: Request, form: dict[str, Any]) -> str:
        name = request.path_params["name"]
        verb = request.path_params["verb"]
        if verb == "pause":
            await dash.app.pause_periodic(name)
            return f"periodic job {name} paused"
        if verb == "resume":
            await dash.app.resume_periodic(name)
            return f"periodic job {name} resumed"
        if verb == "run":
            job_id = await dash.app.run_periodic(name)
            return f"periodic job {name}: job {job_id} enqueued"
        raise HTTPException(404)

    async def http_error(request: Request, exc: Exception) -> Response:
        """An error (unknown page or job, malformed id, bad filter) as a page of the dashboard, with its
        navigation, for whoever may see the dashboard; anyone else gets only the status line."""
        assert isinstance(exc, HTTPException)
        if not dash.guard.authenticated(request):
            return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
        title = HTTPStatus(exc.status_code).phrase
        message = "There is no page at this address." if exc.detail == title and exc.status_code == 404 else exc.detail
        response = dash.render(request, "error.html", title=title, status_code=exc.status_code, message=message)
        response.status_code = exc.status_code
        response.headers.update(exc.headers or {})
        _set_csrf_cookie(request, response)
        response.headers["cache-control"] = "no-store"
        response.headers.update(SECURITY_HEADERS)
        return response

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await dash.close()

    routes = [
        Route("/", page(overview)),
        Route("/jobs", page(jobs)),
        Route("/jobs/bulk", action(bulk_jobs), methods=["POST"]),
        Route("/jobs/{job_id}", page(job_detail)),
        Route("/jobs/{job_id}/retry", action(retry_job), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", action(cancel_job), methods=["POST"]),
        Route("/jobs/{job_id}/delete", action(delete_job), methods=["POST"]),
        Route("/jobs/{job_id}/run-now", action(run_job_now), methods=["POST"]),
        Route("/failures", page(failures)),
        Route("/failures/retry", action(retry_failures), methods=["POST"]),
        Route("/workers", page(workers)),
        Route("/workers/action", action(worker_action), methods=["POST"]),
        Route("/queues", page(queues)),
        Route("/queues/{queue:path}/{verb}", action(queue_action), methods=["POST"]),
        Route("/periodic", page(periodic)),
        Route("/periodic/{name:path}/{verb}", action(periodic_action), methods=["POST"]),
        Route("/groups", page(groups)),
        Route("/groups/{group_id}", page(group_detail)),
        Route("/events", page(events)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/health", health),
        Mount("/static", app=StaticFiles(directory=_package_dir("static")), name="static"),
    ]
    starlette = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(HostGuard, allowed_hosts=allowed_hosts, token=token, host_auth=host_auth)],
    )
    starlette.state.dashboard = dash
    return starlette


# -- helpers ----------------------------------------------------------------------------------------


async def _retry_many(app: App, ids: list[uuid.UUID]) -> int:
    done = 0
    for job_id in ids:
        with contextlib.suppress(InvalidStateError):
            await app.retry(job_id)
            done += 1
    return done


async def _cancel_many(app: App, ids: list[uuid.UUID]) -> int:
    done = 0
    for job_id in ids:
        with contextlib.suppress(InvalidStateError):
            status = await app.cancel(job_id)
            done += status in (JobStatus.CANCELLED, JobStatus.RUNNING)
    return done


async def _delete_many(app: App, ids: list[uuid.UUID]) -> int:
    done = 0
    for job_id in ids:
        with contextlib.suppress(InvalidStateError):
            await app.delete(job_id)
            done += 1
    return done


#: The bulk actions of the jobs page; each counts the selected jobs it acted on (a job in a state the
#: action does not apply to is skipped, as a single action would refuse it).
BULK_ACTIONS: dict[str, Callable[[App, list[uuid.UUID]], Awaitable[int]]] = {
    "retry": _retry_many,
    "cancel": _cancel_many,
    "delete": _delete_many,
}


def _set_csrf_cookie(request: Request, response: Response) -> None:
    new = request.state.__dict__.get("new_csrf")
    if new:
        base = request.scope.get("root_path", "")
        response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="strict", path=base or "/")


def _safe_next(value: Any) -> str | None:
    """A local path to go back to; anything that could leave this site is dropped."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return None
    return value


def _parse_uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def _require_uuid(value: Any) -> uuid.UUID:
    parsed = _parse_uuid(value)
    if parsed is None:
        raise ValueError(f"{value!r} is not a job id")
    return parsed


def _limit(form: dict[str, Any], name: str, parse: Callable[[Any], T | None]) -> T | Keep | None:
    """A limit of the limits form: a field not sent keeps the stored limit, an empty one (or `none`)
    removes it."""
    if name not in form:
        return KEEP
    value = form[name]
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    return parse(value)


def _optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a whole number") from None


def _optional_rate(value: Any) -> RateLimit | None:
    if value in (None, "") or (isinstance(value, str) and not value.strip()):
        return None
    return RateLimit.parse(str(value))


def _progress(current: float | None, total: float | None) -> float | None:
    if current is None or not total:
        return None
    return max(0.0, min(100.0, current * 100.0 / total))


def _charts(series: Series, range_: Range) -> list[Any]:
    by_bucket = {p.bucket: p for p in series.points}
    points = [by_bucket.get(i) for i in range(range_.buckets)]
    lines: list[tuple[str, list[float | None], str, str]] = [
        (f"Completed per {range_.per}", [p.completed if p else None for p in points], "", "ok"),
        (f"Failed per {range_.per}", [p.failed if p else None for p in points], "", "bad"),
        ("Queue depth (available)", [p.available if p else None for p in points], "", "depth"),
        ("Longest wait", [p.oldest_available_seconds or 0.0 if p else None for p in points], "s", "wait"),
    ]
    return [
        line_chart(title, values, since=series.since, range_=range_, unit=unit, css_class=css)
        for title, values, unit, css in lines
    ]


def _range_totals(series: Series, range_: Range) -> dict[str, Any]:
    """The jobs finished in the chosen range, by outcome, and since when the samples cover it (a
    leader that started an hour ago has no samples of the day before)."""
    completed = sum(p.completed for p in series.points)
    failed = sum(p.failed for p in series.points)
    first = min((p.first_sampled_at for p in series.points), default=None)
    partial = first is None or (first - series.since).total_seconds() > range_.step
    return {
        "processed": completed + failed,
        "completed": completed,
        "failed": failed,
        "cancelled": sum(p.cancelled for p in series.points),
        "covered_since": first if partial else None,
        "sampled": first is not None,
    }


#: How much of a job's configuration the jobs list shows.
PREVIEW_CHARS = 120


def _preview(redact: Redactor, configuration: dict[str, Any] | None, stored_bytes: int) -> str:
    """A job's arguments on one line, redacted first, then cut (the template escapes it)."""
    if configuration is None:
        return f"({stored_bytes / 1024:.0f} KiB)"
    text = json.dumps(redact("configuration", configuration), sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _ago(value: datetime | None) -> str:
    if value is None:
        return "—"
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 0:
        return "in " + _seconds(-seconds)
    return _seconds(seconds) + " ago"


def _when(value: datetime | str | None) -> str:
    """A moment as the command line shows it in UTC: 2026-12-02 02:00:00Z (history entries hold ISO text)."""
    if isinstance(value, str):
        text = value
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            return text
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _count(value: int, capped: bool = False) -> str:
    """1,234; a count that stopped at its cap reads 10,000+."""
    return f"{value:,}+" if capped else f"{value:,}"


def _seconds(value: float | timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds):
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _short_id(value: uuid.UUID) -> str:
    """A UUIDv7 shortened to what tells jobs apart: its first 8 digits (time) and its last 6 (random)."""
    text = str(value)
    return f"{text[:8]}…{text[-6:]}"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
