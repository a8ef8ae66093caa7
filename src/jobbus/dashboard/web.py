"""The dashboard as a Starlette application: its routes, each with the role it needs, the guards around
every page and action (tokens, roles, read-only, CSRF, security headers, errors as pages), the live
event stream and the lifespan.

What each page shows is in `pages`, what each action does in `actions`, the login in `auth`; each is a
function of the shared `Dashboard` and the request.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import string
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobbus.audit import acting_as
from jobbus.dashboard import actions, auth, pages
from jobbus.dashboard.roles import PUBLIC, Actor, Role, actor_of, requires
from jobbus.dashboard.security import (
    CSRF_FIELD,
    CSRF_REFUSED,
    SECURITY_HEADERS,
    Guard,
    HostGuard,
    Redactor,
    root_of,
    safe_next,
    set_csrf_cookie,
)
from jobbus.dashboard.state import CELL_DOWN, FLASH_COOKIE, Dashboard, Site, down_reason, package_dir
from jobbus.errors import DatabaseUnavailableError, InvalidJobError, InvalidStateError, SchemaError
from jobbus.producer.plan import SCHEMA_OUTDATED

if TYPE_CHECKING:
    from jobbus.app import App

Endpoint = Callable[[Request], Awaitable[Response]]
Page = Callable[[Dashboard, Request], Awaitable[Response]]
#: An action's line for the next page, or a page of its own (a confirmation step that names what it
#: will do, its form carrying the CSRF token again).
Action = Callable[[Dashboard, Request, dict[str, Any]], Awaitable[str | Response]]
Unavailable = Callable[[Dashboard, Request, str], Response]
#: What a statement raises on a schema older than this code, or none: the guard checks the schema again.
SCHEMA_GONE = (SchemaError, *SCHEMA_OUTDATED)
logger = logging.getLogger("jobbus.dashboard")

#: What a flash message keeps as it is in its cookie (printable ASCII but %).
_FLASH_SAFE = "".join(c for c in string.printable if c not in "%\t\n\r\x0b\x0c")


def create_starlette(
    app: App,
    *,
    guard: Guard,
    redact: Redactor | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of `app`, an App with one database (over cells: `cells.create_cells_starlette`)."""
    dash = Dashboard(app, guard=guard, redact=redact)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await dash.close()

    routes = [*database_routes(dash), *public_routes(dash.site, functools.partial(health, dash))]
    starlette = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: functools.partial(http_error, dash.site)},
        middleware=[Middleware(HostGuard, allowed_hosts=allowed_hosts, guarded=not guard.open)],
    )
    starlette.state.dashboard = dash
    return starlette


def database_routes(dash: Dashboard) -> list[Route]:
    """The pages and actions of one database (of the App, or of one cell), each with the role it needs."""

    def read(handler: Page, **options: Any) -> Endpoint:
        return requires(Role.VIEWER, page(dash, handler, needs=Role.VIEWER, **options))

    def act(needs: Role, handler: Action) -> Endpoint:
        return requires(needs, action(dash, handler, needs=needs))

    operator, admin = Role.OPERATOR, Role.ADMIN
    # The role of each route: see the table in docs/dashboard.md#roles.
    return [
        Route("/", read(pages.overview)),
        Route("/jobs", read(pages.jobs)),
        Route("/jobs/bulk", act(operator, actions.bulk_jobs), methods=["POST"]),
        Route("/jobs/counts", read(pages.job_counts)),
        Route("/jobs/update", act(operator, actions.update_jobs), methods=["POST"]),
        Route("/jobs/{job_id}", read(pages.job_detail)),
        Route("/jobs/{job_id}/retry", act(operator, actions.retry_job), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", act(operator, actions.cancel_job), methods=["POST"]),
        Route("/jobs/{job_id}/delete", act(operator, actions.delete_job), methods=["POST"]),
        Route("/jobs/{job_id}/run-now", act(operator, actions.run_job_now), methods=["POST"]),
        Route("/failures", read(pages.failures)),
        Route("/failures/retry", act(operator, actions.retry_failures), methods=["POST"]),
        Route("/workers", read(pages.workers)),
        Route("/workers/action", act(operator, actions.worker_action), methods=["POST"]),
        Route("/queues", read(pages.queues)),
        Route("/queues/{queue:path}/limits", act(admin, actions.queue_limits), methods=["POST"]),
        Route("/queues/{queue:path}/{verb}", act(operator, actions.queue_action), methods=["POST"]),
        Route("/periodic", read(pages.periodic)),
        Route("/periodic/{name:path}/{verb}", act(admin, actions.periodic_action), methods=["POST"]),
        Route("/groups", read(pages.groups)),
        Route("/audit", read(pages.audit)),
        Route("/groups/{group_id}", read(pages.group_detail)),
        Route("/events", read(events, unavailable=schema_missing_event)),
    ]


def public_routes(site: Site, check_health: Endpoint) -> list[Route | Mount]:
    """What anyone may reach: the login form, logging out, the health check and the static files."""
    return [
        Route("/login", requires(PUBLIC, functools.partial(auth.login, site)), methods=["GET", "POST"]),
        Route("/logout", requires(PUBLIC, functools.partial(auth.logout, site)), methods=["POST"]),
        Route("/health", requires(PUBLIC, check_health)),
        Mount("/static", app=requires(PUBLIC, StaticFiles(directory=package_dir("static"))), name="static"),
    ]


# -- guards -----------------------------------------------------------------------------------------


def page(dash: Dashboard, handler: Page, *, needs: Role, unavailable: Unavailable | None = None) -> Endpoint:
    """`handler` for requests whose actor has the role it `needs` (one without credentials is sent to
    the login form, or gets 401; one whose role is not enough gets 403), with the security headers; on
    a database without the current schema, `unavailable` answers instead (default: `schema_missing`)."""
    answer_unavailable = unavailable or schema_missing

    async def endpoint(request: Request) -> Response:
        refused = refusal(dash.guard, request, needs)
        if refused is not None:
            return refused
        if dash.cell is None:
            response = await answer(request)
        else:
            try:
                response = await answer(request)
            except CELL_DOWN as exc:  # a cell that is down: its pages say so, the others serve
                problem = down_reason(exc)
                logger.warning(
                    "%s %s: cell %s cannot be reached: %s", request.method, request.url.path, dash.cell, problem
                )
                response = (unavailable or cell_down)(dash, request, problem)
        set_csrf_cookie(request, response)
        response.headers.setdefault("cache-control", "no-store")
        response.headers.update(SECURITY_HEADERS)
        return response

    async def answer(request: Request) -> Response:
        await dash.ensure_open()
        problem = await dash.schema_problem()
        if problem is None:
            try:
                response = await handler(dash, request)
            except SCHEMA_GONE:  # a statement met a table that is not there (the schema was dropped?)
                dash.schema_may_have_changed()
                if (problem := await dash.schema_problem()) is None:
                    raise
        if problem is not None:
            logger.warning("%s %s: %s", request.method, request.url.path, problem)
            response = answer_unavailable(dash, request, problem)
        return response

    return endpoint


def refusal(guard: Guard, request: Request, needs: Role) -> Response | None:
    """None when the request's actor has the role `needs`; else the answer: the login form (or 401)
    without credentials, 403 naming the role when the actor's is not enough."""
    actor = guard.actor(request)
    if actor is None:
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if wants_page and guard.token_required:  # without a token, the login form lets nobody in
            root = root_of(request)
            target = request.url.path[len(root) :] + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{root}/login?{urlencode({'next': target})}", status_code=303)
        return PlainTextResponse("authentication required", status_code=401)
    if isinstance(actor, str):
        return PlainTextResponse(actor, status_code=403)
    if not actor.role.allows(needs):
        if guard.read_only:
            return PlainTextResponse("this dashboard is read-only", status_code=403)
        return PlainTextResponse(
            f"this needs the {needs.value} role; {actor.name} has the {actor.role.value} role", status_code=403
        )
    return None


def action(dash: Dashboard, handler: Action, *, needs: Role) -> Endpoint:
    """`handler` as a POST for actors with the role it `needs` (`page` refuses the others before the
    form is read), refused without the CSRF token; its line (or the refusal) goes back to the page
    named by the form's `next` in the flash cookie."""

    async def endpoint(dash: Dashboard, request: Request) -> Response:
        form = await request.form()
        fields: dict[str, Any] = {key: form.getlist(key) if key == "ids" else form.get(key) for key in form}
        submitted = fields.get(CSRF_FIELD)
        if not dash.guard.csrf_ok(request, submitted if isinstance(submitted, str) else None):
            return PlainTextResponse(CSRF_REFUSED, status_code=403)
        try:
            who = actor_of(request)  # the audit trail's actor: the proxy's user, the token's role, the host's user
            with acting_as(who.name if who is not None else "anonymous", source="dashboard"):
                answer = await handler(dash, request, fields)
        except (InvalidStateError, InvalidJobError, ValueError) as exc:
            answer = f"refused: {exc}"
        if isinstance(answer, Response):
            return answer
        message = answer
        base = request.scope.get("root_path", "")
        back = safe_next(fields.get("next")) or "/"
        response = RedirectResponse(base + back, status_code=303)
        # A cookie holds Latin-1 only: anything else (a masked secret's •) is %-escaped, as is % itself.
        flash = quote(message[:300], safe=_FLASH_SAFE)
        response.set_cookie(FLASH_COOKIE, flash, httponly=True, samesite="strict", path=root_of(request) or "/")
        return response

    return page(dash, endpoint, needs=needs)


async def http_error(dash: Site, request: Request, exc: Exception) -> Response:
    """An error (unknown page or job, malformed id, bad filter) as a page of the dashboard, with its
    navigation, for whoever may see the dashboard; anyone else gets only the status line."""
    assert isinstance(exc, HTTPException)
    if not isinstance(dash.guard.actor(request), Actor):
        return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
    title = HTTPStatus(exc.status_code).phrase
    message = "There is no page at this address." if exc.detail == title and exc.status_code == 404 else exc.detail
    response = dash.render(request, "error.html", title=title, status_code=exc.status_code, message=message)
    response.status_code = exc.status_code
    response.headers.update(exc.headers or {})
    set_csrf_cookie(request, response)
    response.headers["cache-control"] = "no-store"
    response.headers.update(SECURITY_HEADERS)
    return response


# -- the live event stream and the health check -----------------------------------------------------


async def events(dash: Dashboard, request: Request) -> Response:
    async def stream() -> AsyncIterator[str]:
        await dash.ensure_open()
        async for chunk in dash.live.events(request.is_disconnected):
            yield chunk

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def health(dash: Dashboard, request: Request) -> Response:
    """`ok`, or 503 saying why the pages cannot be read (no current schema, the database away)."""
    try:
        problem = await dash.schema_problem()
    except DatabaseUnavailableError as exc:
        problem = str(exc)
    if problem is not None:
        logger.warning("%s %s: %s", request.method, request.url.path, problem)
        return PlainTextResponse(problem, status_code=503)
    return PlainTextResponse("ok")


# -- without the schema -----------------------------------------------------------------------------


def schema_missing(dash: Dashboard, request: Request, problem: str) -> Response:
    """The page that says to migrate (JSON to a client that asks for JSON rather than HTML)."""
    accept = request.headers.get("accept", "")
    if "application/json" in accept and "text/html" not in accept:
        return JSONResponse({"error": problem}, status_code=503)
    response = dash.render(
        request,
        "error.html",
        title="Schema not ready",
        status_code=503,
        message=problem,
        hint="The dashboard reads the jobbus schema of its database. Migrate it, then reload this page.",
    )
    response.status_code = 503
    return response


def cell_down(dash: Dashboard, request: Request, problem: str) -> Response:
    """The page of a cell that cannot be reached: its name and the error, the other cells a click away
    (JSON to a client that asks for JSON rather than HTML)."""
    accept = request.headers.get("accept", "")
    if "application/json" in accept and "text/html" not in accept:
        return JSONResponse({"error": problem, "cell": dash.cell}, status_code=503)
    response = dash.render(
        request,
        "error.html",
        title=f"Cell {dash.cell} cannot be reached",
        status_code=503,
        message=problem,
        hint="Its jobs wait in its database; the other cells serve as usual. This page reads it again when reloaded.",
        down=True,
    )
    response.status_code = 503
    return response


def schema_missing_event(dash: Dashboard, request: Request, problem: str) -> Response:
    """The event stream's answer: one `schema` event saying to migrate."""
    return Response(f"event: schema\ndata: {problem}\n\n", status_code=503, media_type="text/event-stream")
