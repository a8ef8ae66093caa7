"""The dashboard mounted in a FastAPI application behind the application's own dependency
(examples/fastapi_dashboard.py), over real HTTP against uvicorn and a real database."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from examples import fastapi_dashboard

import jobbus
from jobbus.contrib.fastapi import mount_dashboard
from jobbus.dashboard import create_app
from tests.conftest import FAST
from tests.contrib.servers import served

KEY = {"x-api-key": fastapi_dashboard.API_KEY}
HTML = {"accept": "text/html"}


@pytest.fixture
def base(dsn: str) -> Iterator[str]:
    app = jobbus.App(dsn=dsn, **FAST)
    with app.sync:
        app.sync.schedule("mail.send", {"to": "a@example.com"}, queue="mail")
    api = fastapi_dashboard.build(app)
    with served(api, lifespan="on", cleanup=api.state.dashboard.state.dashboard.close) as url:
        yield url


def test_without_the_hosts_credentials_its_401_and_its_login_redirect_answer(base: str) -> None:
    with httpx.Client(base_url=base) as http:
        page = http.get("/ops/jobs/", headers=HTML)
        assert page.status_code == 303 and page.headers["location"] == "/login?next=/ops/jobs/"
        for path in ("/ops/jobs/", "/ops/jobs/jobs", "/ops/jobs/events", "/ops/jobs/static/dashboard.css"):
            refused = http.get(path)
            assert refused.status_code == 401, path
            assert refused.json() == {"detail": "log in first"}  # the host's own answer, not the dashboard's
        assert http.post("/ops/jobs/queues/mail/pause", data={"csrf": "x"}).status_code == 401


def test_with_them_the_pages_the_event_stream_and_the_actions(base: str, dsn: str) -> None:
    with httpx.Client(base_url=base, headers={"host": "ops.example.com"}) as http:
        # Served under a public name without allowed_hosts: the host's authentication guards it.
        overview = http.get("/ops/jobs/", headers=KEY)
        assert overview.status_code == 200
        assert 'data-events="/ops/jobs/events"' in overview.text and 'href="/ops/jobs/jobs"' in overview.text
        assert "/logout" not in overview.text  # no token of the dashboard's own
        assert http.get("/ops/jobs", headers=KEY).headers["location"].endswith("/ops/jobs/")

        login = http.post("/login", data={"key": fastapi_dashboard.API_KEY, "next": "/ops/jobs/jobs"})
        assert login.status_code == 303 and login.headers["location"] == "/ops/jobs/jobs"
        jobs = http.get("/ops/jobs/jobs?status=queued")  # the host's session cookie from here on
        assert jobs.status_code == 200 and "mail.send" in jobs.text

        with http.stream("GET", "/ops/jobs/events") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert next(stream.iter_text()).startswith("retry: 2000")

        queues = http.get("/ops/jobs/queues")
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', queues.text)
        assert csrf is not None
        paused = http.post("/ops/jobs/queues/mail/pause", data={"csrf": csrf.group(1), "next": "/queues"})
        assert paused.status_code == 303 and paused.headers["location"] == "/ops/jobs/queues"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT target FROM jobbus.pause WHERE target_kind = 'queue'").fetchall() == [("mail",)]


def test_the_dashboard_needs_a_path_of_its_own_and_one_authentication() -> None:
    from fastapi import FastAPI

    with pytest.raises(ValueError, match="path of its own"):
        mount_dashboard(FastAPI(), "/", fastapi_dashboard.api.state.dashboard, dependencies=[])
    with pytest.raises(ValueError, match="exclude each other"):
        create_app(fastapi_dashboard.app, token="s3cret", host_auth=True)


def test_the_role_callable_gives_each_user_a_role(base: str, dsn: str) -> None:
    view = {"x-api-key": fastapi_dashboard.VIEW_KEY}
    with httpx.Client(base_url=base) as http:
        queues = http.get("/ops/jobs/queues", headers=view)
        assert queues.status_code == 200 and 'auditor · <span class="badge role">viewer</span>' in queues.text
        assert 'action="/ops/jobs/queues/mail/pause"' not in queues.text
        csrf = http.cookies["jobbus_csrf"]  # a viewer's page has no form to take it from
        refused = http.post("/ops/jobs/queues/mail/pause", data={"csrf": csrf}, headers=view)
        assert refused.status_code == 403 and "needs the operator role" in refused.text
        admin = http.get("/ops/jobs/queues", headers=KEY)
        assert 'ops · <span class="badge role">admin</span>' in admin.text
        assert 'action="/ops/jobs/queues/mail/limits"' in admin.text
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.pause").fetchone() == (0,)


async def test_a_role_callable_may_be_async_and_refuse(dsn: str) -> None:
    from fastapi import FastAPI
    from starlette.requests import Request

    from jobbus.dashboard import Role

    async def role_of(request: Request) -> Role | str | None:
        roles: dict[str, Role | str] = {"op": "operator", "admin": Role.ADMIN}
        return roles.get(request.headers.get("x-user", ""))

    app = jobbus.App(dsn=dsn)
    dashboard = create_app(app, host_auth=True)
    api = FastAPI()
    mount_dashboard(api, "/ops", dashboard, dependencies=[], role=role_of)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        refused = await http.get("/ops/queues", headers={"x-user": "nobody"})
        assert refused.status_code == 403 and "no role" in refused.text
        page = await http.get("/ops/queues", headers={"x-user": "op"})
        assert page.status_code == 200 and 'host-user · <span class="badge role">operator</span>' in page.text
        assert 'action="/ops/queues/default/limits"' not in page.text
        limits = await http.post("/ops/queues/default/limits", data={"concurrency": "1"}, headers={"x-user": "op"})
        assert limits.status_code == 403
        form = {"csrf": http.cookies["jobbus_csrf"], "concurrency": "1"}
        assert (
            await http.post("/ops/queues/default/limits", data=form, headers={"x-user": "admin"})
        ).status_code == 303
    await dashboard.state.dashboard.close()
