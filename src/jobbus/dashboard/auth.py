"""Logging in to a dashboard with a token (whose role the session keeps), and out: the form, the session
cookie, the way back."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from jobbus.dashboard.roles import Actor
from jobbus.dashboard.security import (
    CSRF_FIELD,
    CSRF_REFUSED,
    SECURITY_HEADERS,
    SESSION_COOKIE,
    root_of,
    safe_next,
    set_csrf_cookie,
)
from jobbus.dashboard.state import Site


async def login(dash: Site, request: Request) -> Response:
    base = root_of(request)
    target = safe_next(request.query_params.get("next")) or "/"
    if request.method == "POST":
        form = await request.form()
        submitted = form.get(CSRF_FIELD)
        if not dash.guard.csrf_ok(request, submitted if isinstance(submitted, str) else None):
            return PlainTextResponse(CSRF_REFUSED, status_code=403)
        token = form.get("token")
        target = safe_next(form.get("next")) or "/"
        response: Response
        role = dash.guard.token_role(token) if isinstance(token, str) and token else None
        if role is not None:
            response = RedirectResponse(base + target, status_code=303)
            response.set_cookie(
                SESSION_COOKIE,
                dash.guard.session_value(role),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path=base or "/",
            )
            return response
        response = dash.render(request, "login.html", next=target, error="wrong token")
        response.status_code = 401
        set_csrf_cookie(request, response)
        return response
    if not dash.guard.token_required or isinstance(dash.guard.actor(request), Actor):
        return RedirectResponse(base + target, status_code=303)
    response = dash.render(request, "login.html", next=target, error=None)
    set_csrf_cookie(request, response)
    response.headers.update(SECURITY_HEADERS)
    return response


async def logout(dash: Site, request: Request) -> Response:
    base = root_of(request)
    form = await request.form()
    submitted = form.get(CSRF_FIELD)
    if not dash.guard.csrf_ok(request, submitted if isinstance(submitted, str) else None):
        return PlainTextResponse(CSRF_REFUSED, status_code=403)
    response = RedirectResponse(f"{base}/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=base or "/")
    return response
