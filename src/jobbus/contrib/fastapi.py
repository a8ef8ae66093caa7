"""`mount_dashboard(web, "/ops/jobs", dashboard, dependencies=[...])`: the dashboard under a path of a
FastAPI application, behind the application's own dependencies (an API key, a session check).

FastAPI runs no dependency for a mounted sub-application (``web.mount``), so the dashboard is served
by two routes of the application instead (its path and everything under it) that carry the
dependencies: a request the dependencies refuse gets the application's own answer (its 401, its
redirect to a login page) and never reaches the dashboard; the others are handed to the dashboard
unchanged, the live ``/events`` stream included. Make the dashboard with
``create_app(app, host_auth=True)``: it then asks for no token of its own. The dependencies must not
read the request's body (form or JSON parameters): the dashboard's actions read it.

``role=`` gives each request its dashboard role: a callable of the request (after the dependencies,
so it can read what they left in ``request.state``) that returns a `Role` (or its name), an `Actor`
to name the user too, or None to refuse the request (403); it may be async. Without it, everyone
the dependencies let in is an admin.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from fastapi import FastAPI
from fastapi.params import Depends
from fastapi.routing import APIRouter
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from jobbus.dashboard.roles import HOST_ACTOR_KEY, Actor, Role

__all__ = ["RoleOf", "mount_dashboard"]

Given: TypeAlias = Role | str | Actor | None
#: What gives a request its dashboard role (see the module's docstring).
RoleOf: TypeAlias = Callable[[Request], Given | Awaitable[Given]]

_REST = "dashboard_path"


def mount_dashboard(
    web: FastAPI | APIRouter,
    path: str,
    dashboard: ASGIApp,
    *,
    dependencies: Sequence[Depends],
    role: RoleOf | None = None,
) -> None:
    """Serve `dashboard` at `path` of `web` (``/ops/jobs``: ``/ops/jobs/``, ``/ops/jobs/jobs``, ...),
    running `dependencies` on every request first, as for any route of `web`; `role` gives each
    request its role (None: refused)."""
    prefix = "/" + path.strip("/")
    if prefix == "/":
        raise ValueError("mount the dashboard under a path of its own, such as /ops/jobs")

    async def forward(request: Request) -> Response:
        if role is None:
            return _Handover(dashboard, None)
        given = role(request)
        if inspect.isawaitable(given):
            given = await given
        if given is None:
            return PlainTextResponse("this user has no role in the jobs dashboard", status_code=403)
        actor = given if isinstance(given, Actor) else Actor("host-user", Role.parse(given, what="dashboard role"))
        return _Handover(dashboard, actor)

    for route in (prefix, prefix + "/{" + _REST + ":path}"):
        web.add_api_route(
            route,
            forward,
            methods=["GET", "HEAD", "POST"],
            dependencies=list(dependencies),
            include_in_schema=False,
        )


class _Handover(Response):
    """Hands the request to the dashboard, mounted where the route matched (its links, redirects and
    cookies follow that path)."""

    def __init__(self, dashboard: ASGIApp, actor: Actor | None) -> None:
        self.dashboard = dashboard
        self.actor = actor
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        full: str = scope["path"]
        rest: str | None = scope.get("path_params", {}).get(_REST)
        mount = full.rstrip("/") if rest is None else full[: len(full) - len(rest)].rstrip("/")
        child: dict[str, Any] = {k: v for k, v in scope.items() if k not in ("route", "endpoint", "router")}
        child["root_path"] = mount
        child["path_params"] = {}
        child.pop(HOST_ACTOR_KEY, None)
        if self.actor is not None:
            child[HOST_ACTOR_KEY] = self.actor
        await self.dashboard(child, receive, send)
