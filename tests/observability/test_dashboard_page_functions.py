"""A page or action of the dashboard called alone, as a function of the dashboard and a request built for
it, against a real database: no application, no HTTP client, no routes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlencode

import pytest
from starlette.exceptions import HTTPException
from starlette.requests import Request

import jobbus
from jobbus.dashboard import MASK, actions, pages
from jobbus.dashboard.roles import ACTOR_KEY, Actor, Role
from jobbus.dashboard.security import Guard
from jobbus.dashboard.state import Dashboard


@pytest.fixture
async def dash(app: jobbus.App) -> AsyncIterator[Dashboard]:
    dashboard = Dashboard(app, guard=Guard({}, read_only=False), redact=None)
    yield dashboard
    await dashboard.live.close()  # the App is the fixture's to close


def get(path: str, query: Mapping[str, str] | None = None, **path_params: str) -> Request:
    """The request a browser would send for `path`, with the parameters its route would have matched, of
    an admin."""
    return Request(
        {
            "type": "http",
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "server": ("127.0.0.1", 8787),
            "root_path": "",
            "path": path,
            "query_string": urlencode(query or {}).encode(),
            "headers": [(b"host", b"127.0.0.1:8787"), (b"accept", b"text/html")],
            "path_params": path_params,
            ACTOR_KEY: Actor("admin-token", Role.ADMIN),  # as the guard leaves it for the page
        }
    )


async def test_the_jobs_page_alone_lists_the_jobs_of_the_status_asked_for(app: jobbus.App, dash: Dashboard) -> None:
    mail = await app.schedule("mail.send", {"to": "ada"})
    report = await app.schedule("report.render", {"n": 1})
    await app.cancel(report)

    response = await pages.jobs(dash, get("/jobs", {"status": "queued"}))

    html = bytes(response.body).decode()
    assert response.status_code == 200
    assert f"/jobs/{mail}" in html and "mail.send" in html
    assert f"/jobs/{report}" not in html


async def test_the_job_page_alone_shows_the_arguments_redacted_and_refuses_an_unknown_id(
    app: jobbus.App, dash: Dashboard
) -> None:
    job_id = await app.schedule("mail.send", {"to": "ada", "password": "hunter2"})

    response = await pages.job_detail(dash, get(f"/jobs/{job_id}", job_id=str(job_id)))

    html = bytes(response.body).decode()
    assert response.status_code == 200
    assert str(job_id) in html and MASK in html and "hunter2" not in html
    unknown = uuid.uuid4()
    with pytest.raises(HTTPException) as refused:
        await pages.job_detail(dash, get(f"/jobs/{unknown}", job_id=str(unknown)))
    assert refused.value.status_code == 404


async def test_the_queues_page_alone_shows_a_queue_and_its_limits(app: jobbus.App, dash: Dashboard) -> None:
    await app.schedule("report.render", {"n": 1}, queue="reports")
    await app.set_queue("reports", concurrency=3)

    response = await pages.queues(dash, get("/queues"))

    html = bytes(response.body).decode()
    assert response.status_code == 200
    assert "reports" in html and 'name="concurrency" size="5" placeholder="none" value="3"' in html


async def test_an_action_alone_acts_and_returns_the_line_the_next_page_shows(app: jobbus.App, dash: Dashboard) -> None:
    job_id = await app.schedule("mail.send", {"to": "ada"})

    line = await actions.cancel_job(dash, get(f"/jobs/{job_id}/cancel", job_id=str(job_id)), {})

    assert line == f"job {job_id}: cancelled"
    found = await app.find(job_id)
    assert found is not None and found.status is jobbus.JobStatus.CANCELLED
