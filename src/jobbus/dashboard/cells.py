"""The dashboard over cells (SPEC 23): each cell's pages below `/cells/NAME`, the overview of every cell at
the root, a cell switcher in the navigation.

Every page reads and acts in one cell, the one its address names: links, forms, the `next` of an action
and its redirect stay below `/cells/NAME` as they stay below any mount point, so an action posted from
cell b's page acts in b and writes its audit entry there. The login, its cookies (session, CSRF, flash)
and the static files stay at the dashboard's root (`security.root_of`): one login serves every cell.
A cell that cannot be reached is shown as such, its name and its error, while the others serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from jobbus import control, views
from jobbus.dashboard import pages
from jobbus.dashboard.formatting import parse_uuid
from jobbus.dashboard.live import merged_events
from jobbus.dashboard.roles import Role, requires
from jobbus.dashboard.security import SECURITY_HEADERS, Guard, HostGuard, Redactor, RootPath, set_csrf_cookie
from jobbus.dashboard.state import CELL_DOWN, CELL_READ_SECONDS, CELLS_PATH, Dashboard, Site, down_reason
from jobbus.dashboard.web import SCHEMA_GONE, Endpoint, database_routes, http_error, public_routes, refusal
from jobbus.store.views import Count

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from jobbus.app import App


def create_cells_starlette(
    app: App, *, guard: Guard, redact: Redactor | None, allowed_hosts: Sequence[str] | None
) -> Starlette:
    site = Site(guard=guard, redact=redact)
    for name, cell_app in app.cells.items():
        site.cells[name] = Dashboard(cell_app, guard=guard, redact=redact, site=site, cell=name)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await site.close()

    def read(handler: Callable[[Site, Request], Awaitable[Response]]) -> Endpoint:
        return requires(Role.VIEWER, guarded(site, handler))

    routes = [
        Route("/", read(overview)),
        Route("/events", read(events)),
        *(Mount(dash.prefix, routes=database_routes(dash)) for dash in site.cells.values()),
        *public_routes(site, functools.partial(health, site)),
        Route("/{path:path}", read(first_cell)),
    ]
    starlette = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: functools.partial(http_error, site)},
        middleware=[
            Middleware(HostGuard, allowed_hosts=allowed_hosts, guarded=not guard.open),
            Middleware(RootPath),
        ],
    )
    starlette.state.dashboard = site
    return starlette


def guarded(site: Site, handler: Callable[[Site, Request], Awaitable[Response]]) -> Endpoint:
    """`handler` of a root page for viewers (`web.refusal`), with the security headers."""

    async def endpoint(request: Request) -> Response:
        response = refusal(site.guard, request, Role.VIEWER)
        if response is None:
            response = await handler(site, request)
            set_csrf_cookie(request, response)
            response.headers.setdefault("cache-control", "no-store")
            response.headers.update(SECURITY_HEADERS)
        return response

    return endpoint


# -- the overview of every cell ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellPart:
    """One cell on the overview: its queues and workers, or why it cannot be read."""

    name: str
    base: str
    queues: list[views.QueueStatus]
    totals: dict[str, Count]
    workers: control.WorkersSummary | None
    unhandled: int
    #: Why the cell cannot be read: it cannot be reached (`down`), or its schema is not current.
    problem: str | None
    down: bool = False


async def overview(site: Site, request: Request) -> Response:
    """Every cell side by side, each read on its own connections and given `CELL_READ_SECONDS`: a cell
    that is down (or slow) is named with its error while the others render."""
    parts = await asyncio.gather(*(_part(dash, request) for dash in site.cells.values()))
    return site.render(request, "cells.html", parts=parts)


async def _part(dash: Dashboard, request: Request) -> CellPart:
    base = request.scope.get("root_path", "") + dash.prefix
    try:
        async with asyncio.timeout(CELL_READ_SECONDS):
            await dash.ensure_open()
            problem = await dash.schema_problem()
            if problem is None:
                queues, registry, unhandled = await asyncio.gather(
                    pages.queue_rows(dash),
                    control.list_workers(dash.app, forget_after=None),
                    control.unhandled_work(dash.app, cap=1),
                )
                totals = {
                    name: Count.total(getattr(q, name) for q in queues)
                    for name in ("available", "scheduled", "running", "failed")
                }
                workers = control.summarize_workers(registry)
                return CellPart(dash.cell or "", base, queues, totals, workers, len(unhandled), None)
            return CellPart(dash.cell or "", base, [], {}, None, 0, problem)
    except SCHEMA_GONE as exc:  # the schema went away since it was checked
        dash.schema_may_have_changed()
        return CellPart(dash.cell or "", base, [], {}, None, 0, str(exc))
    except TimeoutError:
        problem = f"no answer within {CELL_READ_SECONDS:g} s"
    except CELL_DOWN as exc:
        problem = down_reason(exc)
    return CellPart(dash.cell or "", base, [], {}, None, 0, problem, down=True)


async def events(site: Site, request: Request) -> Response:
    """The overview's live updates: a change in any cell (one listener per cell)."""
    return StreamingResponse(
        merged_events([dash.live for dash in site.cells.values()], request.is_disconnected),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def health(site: Site, request: Request) -> Response:
    """`ok` and each cell's state while some cell can be read; 503 when none can."""
    lines, readable = [], 0
    for name, dash in site.cells.items():
        try:
            await dash.ensure_open()
            problem = await dash.schema_problem()
        except CELL_DOWN as exc:
            problem = down_reason(exc)
        readable += problem is None
        lines.append(f"{name}: {problem or 'ok'}")
    if not readable:
        return PlainTextResponse("no cell can be read\n" + "\n".join(lines), status_code=503)
    return PlainTextResponse("ok\n" + "\n".join(lines))


async def first_cell(site: Site, request: Request) -> Response:
    """A page's address without a cell (a bookmark, a link from before cells): the job's page in the
    cell that holds it for `/jobs/ID`, else that page of the first cell."""
    path = "/" + request.path_params["path"]
    query = f"?{request.url.query}" if request.url.query else ""
    root = request.scope.get("root_path", "")
    parts = path.strip("/").split("/")
    if parts[0] == CELLS_PATH.strip("/"):
        named = f"no cell named {parts[1]!r}" if len(parts) > 1 and parts[1] else "no cell named"
        raise HTTPException(404, f"{named}: the cells are {', '.join(site.cells)}")
    if len(parts) == 2 and parts[0] == "jobs" and (job_id := parse_uuid(parts[1])) is not None:
        for dash in site.cells.values():
            if await dash.holds(job_id):
                return RedirectResponse(f"{root}{dash.prefix}{path}{query}", status_code=303)
        raise HTTPException(404, f"no cell holds a job with the id {job_id}: it may have been deleted, or pruned")
    first = next(iter(site.cells.values()))
    return RedirectResponse(f"{root}{first.prefix}{path}{query}", status_code=303)
