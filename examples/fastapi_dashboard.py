"""The jobbus dashboard inside a FastAPI application, behind the application's own authentication.

    JOBBUS_DSN=postgresql://localhost/shop OPS_API_KEY=change-me OPS_VIEW_KEY=look-only \
        uvicorn examples.fastapi_dashboard:api

``/ops/jobs/`` is the dashboard. The application's dependency `require_operator` lets a request in
when it carries one of the application's keys (``X-API-Key``, for scripts) or the session cookie its
own ``/login`` sets; a browser without either is redirected to ``/login``, anything else gets 401.
The dashboard itself asks for nothing more (``host_auth=True``); `dashboard_role` gives the holder of
``OPS_API_KEY`` the admin role and the holder of ``OPS_VIEW_KEY`` the viewer role.
tests/contrib/test_fastapi_dashboard.py drives it over HTTP.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from urllib.parse import quote

from fastapi import Depends, FastAPI, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse

import jobbus
from jobbus.contrib.asgi import lifespan
from jobbus.contrib.fastapi import mount_dashboard
from jobbus.dashboard import Actor, Role, create_app

app = jobbus.App()  # JOBBUS_DSN from the environment
API_KEY = os.environ.get("OPS_API_KEY", "change-me")
VIEW_KEY = os.environ.get("OPS_VIEW_KEY", "look-only")
KEYS = {"ops": API_KEY, "auditor": VIEW_KEY}  # who holds which key
ROLES = {"ops": Role.ADMIN, "auditor": Role.VIEWER}
SESSION = "ops_session"


def _session_value(user: str) -> str:
    return user + ":" + hmac.new(KEYS[user].encode(), b"ops session", hashlib.sha256).hexdigest()


def _user_of(key: str, cookie: str) -> str | None:
    found = None
    for user, value in KEYS.items():
        if hmac.compare_digest(key.encode(), value.encode()) or hmac.compare_digest(
            cookie.encode(), _session_value(user).encode()
        ):
            found = user
    return found


def require_operator(request: Request) -> None:
    """The application's own check: one of its keys, or its session cookie; it names the user."""
    user = _user_of(request.headers.get("x-api-key", ""), request.cookies.get(SESSION, ""))
    if user is not None:
        request.state.ops_user = user
        return
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        raise HTTPException(status.HTTP_303_SEE_OTHER, headers={"location": f"/login?next={quote(request.url.path)}"})
    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in first", headers={"www-authenticate": "X-API-Key"})


def dashboard_role(request: Request) -> Actor:
    """The dashboard role of the user `require_operator` let in."""
    user = request.state.ops_user
    return Actor(user, ROLES[user])


def build(app: jobbus.App) -> FastAPI:
    """The application: its login, and the dashboard of `app` at /ops/jobs behind `require_operator`."""
    api = FastAPI(lifespan=lifespan(app))
    api.state.dashboard = create_app(app, host_auth=True)
    mount_dashboard(
        api, "/ops/jobs", api.state.dashboard, dependencies=[Depends(require_operator)], role=dashboard_role
    )

    @api.get("/login", response_class=HTMLResponse)
    def login_form(next: str = "/ops/jobs/") -> str:
        return (
            '<form method="post" action="/login"><input type="password" name="key" aria-label="API key">'
            f'<input type="hidden" name="next" value="{quote(next)}"><button>Log in</button></form>'
        )

    @api.post("/login")
    def login(key: str = Form(), next: str = Form("/ops/jobs/")) -> RedirectResponse:
        user = _user_of(key, "")
        if user is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong key")
        target = next if next.startswith("/") and not next.startswith("//") else "/ops/jobs/"
        response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
        response.set_cookie(SESSION, _session_value(user), httponly=True, samesite="strict")
        return response

    return api


api = build(app)
