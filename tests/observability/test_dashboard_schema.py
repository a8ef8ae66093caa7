"""The dashboard on a database without the jobbus schema, or with one a migration behind: every route
answers 503 saying to run `jobbus migrate` (a page, JSON or an event), and the log has one line, no
traceback."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from starlette.routing import Route

import jobbus
from jobbus import schema
from jobbus.dashboard import create_app

BASE = "http://127.0.0.1:8787"
HTML = {"accept": "text/html"}


def one_migration_behind(dsn: str) -> None:
    """Every migration but the last applied and recorded, as `jobbus migrate` of the previous release left it."""
    last = schema.migrations()[-1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split(f"\n-- {last.version:04d}_")[0].encode())


@pytest.fixture(params=["no schema", "a migration behind"])
def outdated(request: pytest.FixtureRequest, empty_dsn: str) -> Iterator[tuple[str, str]]:
    """A database the dashboard cannot read, and what `SchemaError` says of it."""
    if request.param == "no schema":
        yield empty_dsn, "schema jobbus is missing: run `jobbus migrate`"
    else:
        one_migration_behind(empty_dsn)
        behind = schema.latest_version() - 1
        yield empty_dsn, f"schema jobbus is at version {behind}, this code needs {schema.latest_version()}"


@pytest.fixture
async def asgi(outdated: tuple[str, str]) -> AsyncIterator[Any]:
    application = create_app(jobbus.App(dsn=outdated[0]))
    yield application
    await application.state.dashboard.close()


def get_paths(asgi: Any) -> list[str]:
    """Every GET route of the application, its path parameters filled with an id."""
    some_id = str(uuid.uuid4())
    paths = [
        route.path_format.format(**dict.fromkeys(route.param_convertors, some_id))
        for route in asgi.routes
        if isinstance(route, Route) and route.methods and "GET" in route.methods
    ]
    assert {"/", "/jobs", f"/jobs/{some_id}", "/events", "/health"} <= set(paths)
    return paths


async def test_every_get_route_says_to_migrate_with_one_log_line(
    asgi: Any, outdated: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, says = outdated
    caplog.set_level(logging.INFO)
    paths = get_paths(asgi)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=BASE) as http:
        for path in paths:
            response = await http.get(path, headers=HTML, follow_redirects=True)  # /login goes on to /
            assert response.status_code == 503, (path, response.text[:300])
            assert says in response.text and "jobbus migrate" in response.text, path
            if path == "/events":
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.text.startswith("event: schema\ndata: ")
            elif path == "/health":
                assert response.headers["content-type"].startswith("text/plain")
            else:
                assert response.headers["content-type"].startswith("text/html")
                assert "<h1>Schema not ready" in response.text and "reload this page" in response.text
                assert response.headers["x-frame-options"] == "DENY"
        as_json = await http.get("/jobs", headers={"accept": "application/json"})
        assert as_json.status_code == 503 and says in as_json.json()["error"]
    lines = [r for r in caplog.records if r.name.startswith("jobbus")]
    assert lines and all(r.levelno == logging.WARNING and r.exc_info is None for r in lines)
    assert all("\n" not in r.getMessage() and says in r.getMessage() for r in lines)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_after_jobbus_migrate_the_same_dashboard_serves_its_pages(asgi: Any, outdated: tuple[str, str]) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=BASE) as http:
        assert (await http.get("/queues", headers=HTML)).status_code == 503
        with psycopg.connect(outdated[0], autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        assert (await http.get("/queues", headers=HTML)).status_code == 200
        assert (await http.get("/health")).text == "ok"


async def test_a_schema_dropped_under_a_running_dashboard_is_said_at_the_next_page(dsn: str) -> None:
    application = create_app(jobbus.App(dsn=dsn))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url=BASE) as http:
            assert (await http.get("/failures", headers=HTML)).status_code == 200
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DROP SCHEMA jobbus CASCADE")
            gone = await http.get("/failures", headers=HTML)
            assert gone.status_code == 503 and "schema jobbus is missing: run `jobbus migrate`" in gone.text
    finally:
        await application.state.dashboard.close()
