"""The state one dashboard process shares between its requests: the App, its pool, the templates, the
guard (tokens, roles, read-only, CSRF), the redaction hook and the live updates; every page and action is a
function of it and the request."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from jobbus.dashboard import formatting
from jobbus.dashboard.live import LiveUpdates
from jobbus.dashboard.roles import Role, actor_of
from jobbus.dashboard.security import CSRF_FIELD, Guard, Redactor, redact_secrets
from jobbus.dashboard.workflow import parked_without_deadline
from jobbus.encryption import MissingKeyError, UnreadablePayloadError, placeholder, sealed_key_id
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

    def __init__(self, app: App, *, guard: Guard, redact: Redactor | None) -> None:
        self.app = app
        self.guard = guard
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
        self.templates.filters["instant"] = formatting.instant
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

    # -- rendering ----------------------------------------------------------------------------------

    def render(self, request: Request, template: str, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "")
        actor = actor_of(request)
        role = actor.role if actor is not None else Role.VIEWER
        flash = unquote(request.cookies.get(FLASH_COOKIE) or "") or None
        html = self.templates.get_template(template).render(
            request=request,
            base=base,
            path=request.url.path[len(base) :] or "/",
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
            response.delete_cookie(FLASH_COOKIE, path=base or "/")
        return response
