"""The dashboard in a Django project's ASGI application, for staff users only (the admin's check).

In the project's ``asgi.py``::

    from django.core.asgi import get_asgi_application

    django_app = get_asgi_application()  # first: it sets Django up

    from jobbus.contrib.django import get_app
    from jobbus.contrib.django.dashboard import mount_dashboard
    from jobbus.dashboard import create_app

    application = mount_dashboard(django_app, "/ops/jobs", create_app(get_app(), host_auth=True))

A request under the path is answered by the dashboard when the user of its Django session is active
and staff (what ``AdminSite.has_permission`` asks); any other page request is redirected to the login
page (the admin's when ``django.contrib.admin`` is installed, else ``LOGIN_URL``) and any other request
gets 403. The ``Host`` is checked against ``ALLOWED_HOSTS`` as Django checks it. Everything else goes to
Django.
"""

from __future__ import annotations

import io
from importlib import import_module
from typing import Any

from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["mount_dashboard", "staff_only"]


def mount_dashboard(django_app: ASGIApp, path: str, dashboard: ASGIApp, *, login_url: str | None = None) -> ASGIApp:
    """An ASGI application: `dashboard` at `path` (for staff users, `staff_only`), the rest `django_app`."""
    prefix = "/" + path.strip("/")
    if prefix == "/":
        raise ValueError("mount the dashboard under a path of its own, such as /ops/jobs")
    guarded = staff_only(dashboard, login_url=login_url)

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


def staff_only(asgi: ASGIApp, *, login_url: str | None = None) -> ASGIApp:
    """`asgi` for the active staff users of the Django session only."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        from django.core.exceptions import DisallowedHost
        from django.core.handlers.asgi import ASGIRequest

        request = ASGIRequest(scope, io.BytesIO())
        try:
            request.get_host()
        except DisallowedHost:
            await PlainTextResponse("invalid host name", status_code=400)(scope, receive, send)
            return
        user = await _user(request)
        if user.is_active and user.is_staff:
            await asgi(scope, receive, send)
            return
        accept = request.headers.get("accept", "")
        if scope["method"] in ("GET", "HEAD") and "text/html" in accept:
            location = _login_redirect(request.get_full_path(), login_url)
            await RedirectResponse(location, status_code=302)(scope, receive, send)
            return
        await PlainTextResponse("staff only: log in to the admin first", status_code=403)(scope, receive, send)

    return guarded


async def _user(request: Any) -> Any:
    """The user of the request's Django session (AnonymousUser without one). As Django does when a
    request starts and ends, the thread's connections past `CONN_MAX_AGE` or in error are closed before
    it reads and after (and a persistent one is health-checked first with `CONN_HEALTH_CHECKS`): a
    connection left from before a restart or a failover is not the one it reads with."""
    from asgiref.sync import sync_to_async
    from django.conf import settings
    from django.contrib.auth import aget_user
    from django.db import close_old_connections

    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    await sync_to_async(close_old_connections)()
    try:
        return await aget_user(request)
    finally:
        await sync_to_async(close_old_connections)()


def _login_redirect(next_path: str, login_url: str | None) -> str:
    from django.apps import apps
    from django.conf import settings
    from django.contrib.auth.views import redirect_to_login

    if login_url is None:
        login_url = "admin:login" if apps.is_installed("django.contrib.admin") else settings.LOGIN_URL
    return str(redirect_to_login(next_path, login_url)["Location"])
