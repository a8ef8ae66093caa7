"""The dashboard in a Django project's ASGI application, for the users Django gives a dashboard role.

In the project's ``asgi.py``::

    from django.core.asgi import get_asgi_application

    django_app = get_asgi_application()  # first: it sets Django up

    from jobbus.contrib.django import get_app
    from jobbus.contrib.django.dashboard import mount_dashboard
    from jobbus.dashboard import create_app

    application = mount_dashboard(django_app, "/ops/jobs", create_app(get_app(), host_auth=True))

A request under the path is answered by the dashboard when the user of its Django session is active
and has a dashboard role (`default_role`: superusers are admins, staff are operators, and the
permissions ``jobbus.administer_jobs``, ``jobbus.operate_jobs`` and ``jobbus.view_jobs`` give the
three roles to anyone; ``role=`` replaces the rule); any other page request is redirected to the login
page (the admin's when ``django.contrib.admin`` is installed, else ``LOGIN_URL``) and any other request
gets 403. The ``Host`` is checked against ``ALLOWED_HOSTS`` as Django checks it. Everything else goes to
Django.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from importlib import import_module
from typing import Any, TypeAlias

from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from jobbus.dashboard.roles import HOST_ACTOR_KEY, Actor, Role

__all__ = [
    "ADMINISTER_PERMISSION",
    "OPERATE_PERMISSION",
    "VIEW_PERMISSION",
    "UserRole",
    "default_role",
    "mount_dashboard",
    "staff_only",
]

ADMINISTER_PERMISSION = "jobbus.administer_jobs"
OPERATE_PERMISSION = "jobbus.operate_jobs"
VIEW_PERMISSION = "jobbus.view_jobs"
#: The dashboard role of an active Django user (a `Role` or its name), or None to refuse them. Called
#: in Django's thread for synchronous code, so it may query the database.
UserRole: TypeAlias = Callable[[Any], Role | str | None]


def default_role(user: Any) -> Role | None:
    """Superusers and holders of ``jobbus.administer_jobs`` are admins; staff and holders of
    ``jobbus.operate_jobs`` operators; holders of ``jobbus.view_jobs`` viewers; anyone else none."""
    if user.is_superuser or user.has_perm(ADMINISTER_PERMISSION):
        return Role.ADMIN
    if user.is_staff or user.has_perm(OPERATE_PERMISSION):
        return Role.OPERATOR
    if user.has_perm(VIEW_PERMISSION):
        return Role.VIEWER
    return None


def mount_dashboard(
    django_app: ASGIApp,
    path: str,
    dashboard: ASGIApp,
    *,
    login_url: str | None = None,
    role: UserRole = default_role,
) -> ASGIApp:
    """An ASGI application: `dashboard` at `path` (for the users `role` gives a role, `staff_only`),
    the rest `django_app`."""
    prefix = "/" + path.strip("/")
    if prefix == "/":
        raise ValueError("mount the dashboard under a path of its own, such as /ops/jobs")
    guarded = staff_only(dashboard, login_url=login_url, role=role)

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            root: str = scope.get("root_path", "")
            full: str = scope["path"]
            route = full[len(root) :] if root and full.startswith(root) else full
            if route == prefix or route.startswith(prefix + "/"):
                await guarded({**scope, "root_path": root + prefix}, receive, send)
                return
        await django_app(scope, receive, send)

    return application


def staff_only(asgi: ASGIApp, *, login_url: str | None = None, role: UserRole = default_role) -> ASGIApp:
    """`asgi` for the active users of the Django session that `role` gives a dashboard role (by
    default, `default_role`: staff and superusers, and holders of the jobbus permissions), each with
    that role."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        from django.core.exceptions import DisallowedHost
        from django.core.handlers.asgi import ASGIRequest

        request = ASGIRequest(scope, io.BytesIO())
        try:
            request.get_host()
        except DisallowedHost:
            await PlainTextResponse("invalid host name", status_code=400)(scope, receive, send)
            return
        actor = await _actor(request, role)
        if actor is not None:
            await asgi({**scope, HOST_ACTOR_KEY: actor}, receive, send)
            return
        accept = request.headers.get("accept", "")
        if scope["method"] in ("GET", "HEAD") and "text/html" in accept:
            location = _login_redirect(request.get_full_path(), login_url)
            await RedirectResponse(location, status_code=302)(scope, receive, send)
            return
        await PlainTextResponse(
            "no role in the jobs dashboard: log in to the admin first, as a user with one", status_code=403
        )(scope, receive, send)

    return guarded


async def _actor(request: Any, role: UserRole) -> Actor | None:
    """The user of the request's Django session and the role `role` gives them, or None (no session,
    an inactive user, no role). As Django does when a request starts and ends, the thread's
    connections past `CONN_MAX_AGE` or in error are closed before it reads and after (and a persistent
    one is health-checked first with `CONN_HEALTH_CHECKS`): a connection left from before a restart or
    a failover is not the one it reads with."""
    from asgiref.sync import sync_to_async
    from django.conf import settings
    from django.contrib.auth import aget_user
    from django.db import close_old_connections

    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    await sync_to_async(close_old_connections)()
    try:
        user = await aget_user(request)
        if not user.is_active:
            return None
        given = await sync_to_async(role)(user)
        if given is None:
            return None
        return Actor(user.get_username(), Role.parse(given, what="dashboard role"))
    finally:
        await sync_to_async(close_old_connections)()


def _login_redirect(next_path: str, login_url: str | None) -> str:
    from django.apps import apps
    from django.conf import settings
    from django.contrib.auth.views import redirect_to_login

    if login_url is None:
        login_url = "admin:login" if apps.is_installed("django.contrib.admin") else settings.LOGIN_URL
    return str(redirect_to_login(next_path, login_url)["Location"])
