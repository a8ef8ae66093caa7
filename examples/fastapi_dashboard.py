"""The jobbus dashboard inside a FastAPI application, behind the application's own authentication.

    JOBBUS_DSN=postgresql://localhost/shop OPS_API_KEY=change-me uvicorn examples.fastapi_dashboard:api

``/ops/jobs/`` is the dashboard. The application's dependency `require_operator` lets a request in
when it carries the application's API key (``X-API-Key``, for scripts) or the session cookie its own
``/login`` sets; a browser without either is redirected to ``/login``, anything else gets 401. The
dashboard itself asks for nothing more (``host_auth=True``). tests/contrib/test_fastapi_dashboard.py
drives it over HTTP.
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
from jobbus.dashboard import create_app

app = jobbus.App()  # JOBBUS_DSN from the environment
API_KEY = os.environ.get("OPS_API_KEY", "change-me")
SESSION = "ops_session"


def _session_value() -> str:
    return hmac.new(API_KEY.encode(), b"ops session", hashlib.sha256).hexdigest()


def require_operator(request: Request) -> None:
    """The application's own check: its API key, or its session cookie."""
    key = request.headers.get("x-api-key", "")
    cookie = request.cookies.get(SESSION, "")
    if hmac.compare_digest(key.encode(), API_KEY.encode()) or hmac.compare_digest(
        cookie.encode(), _session_value().encode()
    ):
        return
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        raise HTTPException(status.HTTP_303_SEE_OTHER, headers={"location": f"/login?next={quote(request.url.path)}"})
    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in first", headers={"www-authenticate": "X-API-Key"})


def build(app: jobbus.App) -> FastAPI:
    """The application: its login, and the dashboard of `app` at /ops/jobs behind `require_operator`."""
    api = FastAPI(lifespan=lifespan(app))
    api.state.dashboard = create_app(app, host_auth=True)
    mount_dashboard(api, "/ops/jobs", api.state.dashboard, dependencies=[Depends(require_operator)])

    @api.get("/login", response_class=HTMLResponse)
    def login_form(next: str = "/ops/jobs/") -> str:
        return (
            '<form method="post" action="/login"><input type="password" name="key" aria-label="API key">'
            f'<input type="hidden" name="next" value="{quote(next)}"><button>Log in</button></form>'
        )

    @api.post("/login")
    def login(key: str = Form(), next: str = Form("/ops/jobs/")) -> RedirectResponse:
        if not hmac.compare_digest(key.encode(), API_KEY.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong key")
        target = next if next.startswith("/") and not next.startswith("//") else "/ops/jobs/"
        response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
        response.set_cookie(SESSION, _session_value(), httponly=True, samesite="strict")
        return response

    return api


api = build(app)
