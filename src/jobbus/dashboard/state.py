"""The state one dashboard process shares between its requests: the App, its pool, the templates, the
guard (token, read-only, CSRF), the redaction hook and the live updates; every page and action is a
function of it and the request."""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from jobbus.dashboard import formatting
from jobbus.dashboard.live import LiveUpdates
from jobbus.dashboard.security import CSRF_FIELD, Guard, Redactor, redact_secrets
from jobbus.dashboard.workflow import parked_without_deadline
from jobbus.errors import SchemaError
from jobbus.store.dashboard import DashboardStore
from jobbus.store.statements import Operation, Statement, run_async, run_read_async

if TYPE_CHECKING:
    from jobbus.app import App

T = TypeVar("T")
FLASH_COOKIE = "jobbus_flash"


def package_dir(name: str) -> str:
    return str(Path(str(resources.files("jobbus.dashboard").joinpath(name))))


class Dashboard:
    """State shared by the requests of one dashboard process."""

    def __init__(self, app: App, *, read_only: bool, token: str | None, redact: Redactor | None) -> None:
        self.app = app
        self.guard = Guard(token, read_only=read_only)
        self.redact = redact if redact is not None else redact_secrets
        self.store = DashboardStore(app.settings.schema)
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
        self.templates.filters["next_run"] = formatting.next_run
        self.templates.filters["pretty"] = formatting.pretty
        self.templates.filters["compact"] = formatting.compact
        self.templates.filters["shortid"] = formatting.short_id
        self.templates.filters["parked_without_deadline"] = parked_without_deadline
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._schema_current = False
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

    # -- rendering ----------------------------------------------------------------------------------

    def render(self, request: Request, template: str, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "")
        flash = unquote(request.cookies.get(FLASH_COOKIE) or "") or None
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
