"""The state one dashboard process shares between its requests: the App, its pool, the templates, the
guard (tokens, roles, read-only, CSRF), the redaction hook and the live updates; every page and action is a
function of it and the request. Over cells, one `Dashboard` per cell, all of one `Site`."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import HTMLResponse

from jobbus.dashboard import formatting
from jobbus.dashboard.live import LiveUpdates
from jobbus.dashboard.roles import Role, actor_of
from jobbus.dashboard.security import CSRF_FIELD, Guard, Redactor, redact_secrets, root_of
from jobbus.dashboard.workflow import parked_without_deadline
from jobbus.encryption import MissingKeyError, UnreadablePayloadError, placeholder, sealed_key_id
from jobbus.errors import DatabaseUnavailableError, SchemaError
from jobbus.resilience import first_line
from jobbus.settings import redact
from jobbus.store.dashboard import DashboardStore
from jobbus.store.statements import Operation, Statement, run_async, run_read_async

if TYPE_CHECKING:
    from jobbus.app import App

T = TypeVar("T")
FLASH_COOKIE = "jobbus_flash"


def package_dir(name: str) -> str:
    return str(Path(str(resources.files("jobbus.dashboard").joinpath(name))))


#: A cell's database is given this long to connect when its pages first need it (a page of a cell that
#: is down says so within this time, never waits `database_wait_seconds`).
CELL_OPEN_SECONDS = 2.0
#: After a cell could not be reached, its pages say so at once for this long; then it is tried again.
CELL_RETRY_SECONDS = 5.0
#: The overview of every cell, and the search of a job's cell, wait this long for one cell's answer; a
#: cell slower than that is shown as not answering (its pool may wait `database_wait_seconds`).
CELL_READ_SECONDS = 5.0
#: What a cell that cannot be reached raises: it is shown as down, its error named, never as a 500.
CELL_DOWN: tuple[type[Exception], ...] = (DatabaseUnavailableError, psycopg.OperationalError, PoolTimeout)
#: What keeps a cell's jobs from being read: down, too slow, or without the current schema.
CELL_UNREADABLE: tuple[type[Exception], ...] = (*CELL_DOWN, TimeoutError, SchemaError)


class Site:
    """What the pages of every cell share: the guard, the templates, the redaction hook, the rendering,
    and the dashboard of each cell in cell order (empty without cells: the App's one `Dashboard` then
    has a `Site` of its own)."""

    def __init__(self, *, guard: Guard, redact: Redactor | None) -> None:
        self.guard = guard
        self.redact = redact if redact is not None else redact_secrets
        self.cells: dict[str, Dashboard] = {}
        self.templates = Environment(
            loader=FileSystemLoader(package_dir("templates")),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["ago"] = formatting.ago
        self.templates.filters["seconds"] = formatting.seconds
        self.templates.filters["count"] = formatting.count
        self.templates.filters["bounded"] = formatting.bounded
        self.templates.filters["when"] = formatting.when
        self.templates.filters["instant"] = formatting.instant
        self.templates.filters["next_run"] = formatting.next_run
        self.templates.filters["pretty"] = formatting.pretty
        self.templates.filters["compact"] = formatting.compact
        self.templates.filters["shortid"] = formatting.short_id
        self.templates.filters["parked_without_deadline"] = parked_without_deadline

    async def close(self) -> None:
        for dash in self.cells.values():
            await dash.close()

    def end_streams(self) -> None:
        for dash in self.cells.values():
            dash.live.end_streams()

    def cell_of(self, request: Request) -> str | None:
        """The cell whose pages `request` is on (its mount `/cells/NAME`), None at the root or without cells."""
        prefix = request.scope.get("root_path", "")[len(root_of(request)) :]
        name = prefix.removeprefix(CELLS_PATH + "/")
        return name if prefix and name in self.cells else None

    # -- rendering ----------------------------------------------------------------------------------

    def render(self, request: Request, template: str, **context: Any) -> HTMLResponse:
        """`template` with what every page shows: the navigation (over cells, the cell switcher, the
        current cell's pages), the actor and its role, the CSRF token, the last action's line."""
        base = request.scope.get("root_path", "")
        root = root_of(request)
        actor = actor_of(request)
        role = actor.role if actor is not None else Role.VIEWER
        flash = unquote(request.cookies.get(FLASH_COOKIE) or "") or None
        path = request.url.path[len(base) :] or "/"
        cell = self.cell_of(request)
        html = self.templates.get_template(template).render(
            request=request,
            base=base,
            root=root,
            path=path,
            cell=cell,
            cell_links=self._cell_links(request, root, path) if self.cells else [],
            csrf=self.guard.csrf_token(request),
            csrf_field=CSRF_FIELD,
            read_only=self.guard.read_only,
            token_required=self.guard.token_required,
            actor=actor,
            can_operate=role.allows(Role.OPERATOR),
            can_administer=role.allows(Role.ADMIN),
            flash=flash,
            page=template.removesuffix(".html"),
            fragment=request.headers.get("x-jobbus-fragment") == "1",
            **context,
        )
        response = HTMLResponse(html)
        if flash:
            response.delete_cookie(FLASH_COOKIE, path=root or "/")
        return response

    def _cell_links(self, request: Request, root: str, path: str) -> list[tuple[str, str]]:
        """The cell switcher: each cell's link to the page shown now (a list keeps its filters but its
        page cursor; a job's or a group's page goes to its list), from the root's overview of every cell
        to each cell's overview."""
        section = "/" + path.strip("/").split("/")[0] if path.strip("/") else "/"
        query = ""
        if section == path.rstrip("/") or path == "/":
            kept = [(k, v) for k, v in request.query_params.multi_items() if k not in ("after", "children_after")]
            query = ("?" + urlencode(kept)) if kept and self.cell_of(request) is not None else ""
        return [(name, f"{root}{dash.prefix}{section}{query}") for name, dash in self.cells.items()]


#: The path below which each cell's pages are mounted: `/cells/NAME/...`.
CELLS_PATH = "/cells"


class Dashboard:
    """The pages of one database: the App's (one cell's, over cells), its pool, its live updates."""

    def __init__(
        self, app: App, *, guard: Guard, redact: Redactor | None, site: Site | None = None, cell: str | None = None
    ) -> None:
        self.app = app
        self.site = site if site is not None else Site(guard=guard, redact=redact)
        self.guard = self.site.guard
        self.redact = self.site.redact
        #: The cell whose pages these are, mounted at `prefix`; None (and "") without cells.
        self.cell = cell
        self.prefix = f"{CELLS_PATH}/{cell}" if cell is not None else ""
        self.store = DashboardStore(app.settings.schema)
        self.templates = self.site.templates
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._schema_current = False
        self._down: str | None = None
        self._retry_at = 0.0
        self.live = LiveUpdates(
            pulse=lambda: self.run(self.store.pulse()),
            listen_dsn=app.settings.notification_dsn,
            job_channel=app.store.channel,
            control_channel=app.store.control_channel,
        )

    def end_streams(self) -> None:
        self.live.end_streams()

    async def elsewhere(self, job_id: uuid.UUID) -> Dashboard | None:
        """The dashboard of another cell that holds the job, in cell order (None without cells)."""
        for other in self.site.cells.values():
            if other is not self and await other.holds(job_id):
                return other
        return None

    async def ensure_open(self) -> None:
        """Open the App's pool on first use (a mounted sub-application gets no lifespan of its own). A
        cell's pool is given `CELL_OPEN_SECONDS`; a cell that could not be reached raises
        `DatabaseUnavailableError` at once for `CELL_RETRY_SECONDS`, then is tried again."""
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    if self.cell is None:
                        await self.app.open()
                    else:
                        await self._open_cell()
                    self._opened = True

    async def _open_cell(self) -> None:
        if self._down is not None and time.monotonic() < self._retry_at:
            raise DatabaseUnavailableError(self._down)
        try:
            await self.app.open(timeout=CELL_OPEN_SECONDS)
        except Exception as exc:
            # The connection's own error (refused, no such host, authentication) says more than the
            # wait's: the time given is the dashboard's, not `database_wait_seconds`.
            cause = exc.__cause__ if isinstance(exc, DatabaseUnavailableError) else None
            self._down = down_reason(cause if isinstance(cause, Exception) else exc)
            self._retry_at = time.monotonic() + CELL_RETRY_SECONDS
            raise DatabaseUnavailableError(self._down) from exc
        self._down = None

    async def holds(self, job_id: uuid.UUID) -> bool:
        """Whether this cell holds the job (False when the cell cannot be read, given `CELL_READ_SECONDS`)."""
        try:
            async with asyncio.timeout(CELL_READ_SECONDS):
                await self.ensure_open()
                return await self.app.find(job_id) is not None
        except CELL_UNREADABLE:
            return False

    async def close(self) -> None:
        await self.live.close()
        if self._opened:
            self._opened = False
            await self.app.close()

    async def schema_problem(self) -> str | None:
        """What keeps the pages from reading the database, as `SchemaError` says it (no jobbus schema, or
        one older than this code: run `jobbus migrate`), or None. A current schema is checked once, and
        again after `schema_may_have_changed`."""
        if self._schema_current:
            return None
        await self.ensure_open()
        try:
            await self.app.check_schema()
        except SchemaError as exc:
            return str(exc)
        self._schema_current = True
        return None

    def payload(self, job_id: uuid.UUID, job_type: str, field: str, value: Any) -> Any:
        """A stored payload as a page may show it: opened when it is sealed with a key the dashboard's App
        holds, a placeholder naming the key when not (`jobbus.encryption`), else as stored."""
        if sealed_key_id(value) is None:
            return value
        keyring = self.app.registry.keyring
        if keyring is not None:
            with contextlib.suppress(MissingKeyError, UnreadablePayloadError):
                return keyring.open(value, field, job_id, job_type, field)
        return placeholder(value)

    def schema_may_have_changed(self) -> None:
        """A statement met a table, column or function that is not there: check the schema again."""
        self._schema_current = False

    async def run(self, statement: Statement[T]) -> T:
        await self.ensure_open()
        async with self.app.pool.connection() as conn:
            return await run_read_async(conn, statement)

    async def act(self, operation: Operation[T]) -> T:
        """Run an action's operation (with its audit entry) in one transaction."""
        await self.ensure_open()
        async with self.app.pool.connection() as conn:
            return await run_async(conn, operation)

    def render(self, request: Request, template: str, **context: Any) -> HTMLResponse:
        return self.site.render(request, template, **context)


def down_reason(exc: BaseException) -> str:
    """What a page says of a cell that cannot be reached: the error's first line, secrets redacted."""
    if isinstance(exc, DatabaseUnavailableError):
        return str(exc)
    return f"{type(exc).__name__}: {redact(first_line(exc)) or 'no answer'}"
