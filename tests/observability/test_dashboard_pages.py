"""The dashboard's job page for workflows, folded failure groups, the groups' stacked bar, error pages
and the login page, over HTTP against real rows."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import psycopg.sql
import pytest

import jobbus
from jobbus.dashboard import create_app
from jobbus.store.dashboard import DashboardStore

BASE = "http://127.0.0.1:8787"


@pytest.fixture
async def asgi(dsn: str) -> AsyncIterator[Any]:
    application = create_app(jobbus.App(dsn=dsn))
    yield application
    await application.state.dashboard.close()


def client(asgi: Any, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=BASE, **kwargs)


def fail_with(dsn: str, errors: list[str]) -> list[uuid.UUID]:
    """One failed job per error message, written as a worker's outcome would leave it."""
    app = jobbus.App(dsn=dsn)
    with app.sync:
        ids = app.sync.schedule_many("report.render", [{"n": n} for n in range(len(errors))], queue="reports")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job_id, error in zip(ids, errors, strict=True):
            conn.execute(
                "UPDATE jobbus.job SET status = 'failed', attempts = 1, finished_at = now(), last_error = %s "
                "WHERE id = %s",
                (error, job_id),
            )
    return ids


async def test_failure_groups_fold_ids_addresses_quoted_values_and_numbers(dsn: str, asgi: Any) -> None:
    fail_with(
        dsn,
        [
            "app.NotFound: user 123 not found",
            "app.NotFound: user 456 not found",
            "KeyError: 'a'",
            "KeyError: 'b'",
            'KeyError: "it\'s"',
            "app.Gone: job 0190a3b4-1c2d-7e8f-9a0b-1c2d3e4f5a6b is gone",
            "app.Gone: job 0190a3b4-0000-7e8f-9a0b-ffffffffffff is gone",
            "app.Bounce: mail to ann.lee+news@example.com bounced",
            "app.Bounce: mail to bob@mail.example.org bounced",
            "app.Digest: sha 9f86d081884c7d659a2feaa0c55ad015 differs",
            "app.Digest: sha 60303ae22b998861bce3b28f33eec1be differs",
            "app.S3Error: bucket unavailable",
            "app.S4Error: bucket unavailable",
            "app.Retry: don't retry 'x' now",
            "app.Retry: don't retry 'y' now",
        ],
    )
    groups = [group for group, _ in await asgi.state.dashboard.run(DashboardStore("jobbus").failures())]
    found = {g.pattern: g.count.value for g in groups}
    assert found == {
        "app.NotFound: user <n> not found": 2,
        "KeyError: <str>": 3,
        "app.Gone: job <id> is gone": 2,
        "app.Bounce: mail to <email> bounced": 2,
        "app.Digest: sha <id> differs": 2,
        "app.S3Error: bucket unavailable": 1,  # a digit glued to a letter is part of a name
        "app.S4Error: bucket unavailable": 1,
        "app.Retry: don't retry <str> now": 2,  # an apostrophe inside a word opens no quote
    }
    assert {g.error_class for g in groups} >= {"app.NotFound", "KeyError", "app.S3Error"}
    async with client(asgi) as http:
        page = (await http.get("/failures")).text
    assert page.count("data-pattern=") == 8
    assert "user &lt;n&gt; not found" in page  # the pattern is shown under the example


async def test_a_failure_group_names_itself_without_its_secrets_and_retries(dsn: str, asgi: Any) -> None:
    ids = fail_with(
        dsn, ["app.AuthError: password=hunter2 refused for 7", "app.AuthError: password=hunter2 refused for 8"]
    )
    async with client(asgi) as http:
        page = (await http.get("/failures")).text
        assert "hunter2" not in page  # neither the example, the pattern, nor the retry form's key
        key = re.search(r'data-pattern="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page).group(1)  # type: ignore[union-attr]
        response = await http.post("/failures/retry", data={"csrf": csrf, "pattern": key, "next": "/failures"})
        assert response.status_code == 303
    async with jobbus.App(dsn=dsn) as app:
        assert {(await app.find(i)).status for i in ids} == {jobbus.JobStatus.QUEUED}  # type: ignore[union-attr]


def workflow(dsn: str, *, children: int, active: int) -> dict[str, Any]:
    """A parent parked in `wait_for_children` with its steps and children, as the workflow functions
    leave the rows: steps in job_step, children in job_child, the count of active ones in job_parent."""
    app = jobbus.App(dsn=dsn)
    with app.sync:
        parent = app.sync.schedule("flow.parent", {"order": 7}, queue="flows")
        kids = app.sync.schedule_many("flow.child", [{"n": n} for n in range(children)], queue="flows")
    entry = {"attempt": 1, "outcome": "waiting", "at": "2026-12-02T01:00:00+00:00", "waiting_for": "children"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobbus.job SET available_at = jobbus.never(), history = %s::jsonb WHERE id = %s",
            (json.dumps([entry]), parent),
        )
        conn.execute(
            "INSERT INTO jobbus.job_step (job_id, name, result, attempt, created_at) VALUES "
            "(%(p)s, 'fetch', '{\"rows\": 12, \"api_token\": \"tok-31337\"}', 1, now() - interval '5 min'), "
            "(%(p)s, 'sleep:cool-down', jsonb_build_object('until', now() - interval '3 min'), 1, "
            "now() - interval '4 min'), "
            "(%(p)s, 'event:approved', '{\"payload\": {\"by\": \"ann\"}}', 1, now() - interval '2 min')",
            {"p": parent},
        )
        conn.execute(
            "INSERT INTO jobbus.job_step (job_id, name, result, attempt) "
            "SELECT %s, 'spawn:flow.child:0000:' || n, to_jsonb(c::text), 1 "
            "FROM unnest(%s::uuid[]) WITH ORDINALITY AS k(c, n)",
            (parent, kids),
        )
        conn.execute("INSERT INTO jobbus.job_child (child_id, parent_id) SELECT unnest(%s::uuid[]), %s", (kids, parent))
        conn.execute(
            "INSERT INTO jobbus.job_parent (parent_id, active, waiting) VALUES (%s, %s, true)", (parent, children)
        )
        # The trigger job_finished takes each child that ends off its parent's active ones.
        conn.execute(
            "UPDATE jobbus.job SET status = 'completed', attempts = 1, finished_at = now() WHERE id = ANY(%s::uuid[])",
            (kids[: children - active],),
        )
    return {"parent": parent, "children": kids}


async def test_the_job_page_shows_a_workflows_steps_children_parent_and_why_it_waits(dsn: str, asgi: Any) -> None:
    flow = workflow(dsn, children=3, active=2)
    parent, kids = flow["parent"], flow["children"]
    async with client(asgi) as http:
        page = (await http.get(f"/jobs/{parent}")).text
        child = (await http.get(f"/jobs/{kids[0]}")).text
    steps = re.findall(r'<tr data-step="([^"]+)">', page)
    assert steps == ["fetch", "cool-down", "approved"]  # recorded order; spawn steps are the children
    assert "&#34;rows&#34;: 12" in page and "tok-31337" not in page  # previews are redacted
    assert "received" in page and "&#34;by&#34;: &#34;ann&#34;" in page and "woke" in page
    rows = re.findall(r'<tr data-child="([^"]+)">.*?<span class="status (\w+)">', page)
    assert rows == [(str(kids[0]), "completed"), (str(kids[1]), "queued"), (str(kids[2]), "queued")]
    assert '<h2>Children <span class="count">3, 2 not finished</span></h2>' in page
    assert "waiting for 2 children" in page  # the parked attempt says what it waits for
    assert f'href="/jobs/{parent}" class="parent"' in child
    assert "flow.parent" in child and '<span class="status queued">queued</span>' in child


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
async def test_a_parked_job_says_until_when_it_sleeps_and_which_event_it_waits_for(
    dsn: str, asgi: Any, zone: str
) -> None:
    """Whatever the database session's time zone (west of UTC, never() reads as a day of 8999)."""
    app = jobbus.App(dsn=dsn)
    with app.sync:
        napping = app.sync.schedule("flow.nap", {})
        waiting = app.sync.schedule("flow.approve", {})
    with psycopg.connect(dsn, autocommit=True) as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET timezone TO {}").format(
                psycopg.sql.Identifier(database), psycopg.sql.Literal(zone)
            )
        )
        for job_id, step, what, until in [
            (napping, "sleep:nap", "sleep:nap", "now() + interval '1 hour'"),
            (waiting, "event:order-7", "event order-7", "NULL::timestamptz"),
        ]:
            entry = {"attempt": 1, "outcome": "waiting", "at": "2026-12-02T01:00:00+00:00", "waiting_for": what}
            conn.execute(
                f"UPDATE jobbus.job SET available_at = coalesce({until}, jobbus.never()), history = %s::jsonb "
                "WHERE id = %s",
                (json.dumps([entry]), job_id),
            )
            conn.execute(
                "INSERT INTO jobbus.job_step (job_id, name, result, attempt) "
                f"VALUES (%s, %s, jsonb_build_object('until', {until}), 1)",
                (job_id, step),
            )
    async with client(asgi) as http:
        nap = (await http.get(f"/jobs/{napping}")).text
        wait = (await http.get(f"/jobs/{waiting}")).text
    assert re.search(r'<span class="reason">sleeping \(nap\) until \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(in 60 min\)', nap)
    assert '<span class="status sleeping">sleeping</span>' in nap
    assert '<span class="reason">waiting for event order-7</span>' in wait
    assert "when woken (parked without a deadline)" in wait  # not "available in 2,546,865 days"
    assert '<span class="status waiting">waiting</span>' in wait


async def test_a_parent_of_many_children_shows_them_page_by_page(dsn: str, asgi: Any) -> None:
    flow = workflow(dsn, children=120, active=120)
    seen: list[str] = []
    async with client(asgi) as http:
        url: str | None = f"/jobs/{flow['parent']}"
        first = True
        while url:
            page = (await http.get(url)).text
            shown = re.findall(r'<tr data-child="([^"]+)">', page)
            assert len(shown) <= 50
            if first:
                assert "120, 120 not finished" in page
                first = False
            seen += shown
            found = re.search(r'href="(/jobs/[^"]+\?children_after=[^"]+)" rel="next"', page)
            url = found.group(1) if found else None
    assert seen == [str(k) for k in sorted(flow["children"], key=lambda k: k.bytes)]


async def test_groups_show_a_stacked_bar_of_their_outcomes(dsn: str, asgi: Any) -> None:
    app = jobbus.App(dsn=dsn)
    group = uuid.uuid4()
    with app.sync:
        ids = app.sync.schedule_many("report.render", [{"n": n} for n in range(60)], group_id=group)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = ANY(%s)", (ids[:51],))
        conn.execute("UPDATE jobbus.job SET status = 'failed', finished_at = now() WHERE id = ANY(%s)", (ids[51:],))
    async with client(asgi) as http:
        for path in ["/groups", f"/groups/{group}"]:
            page = (await http.get(path)).text
            assert 'role="img" aria-label="51 completed, 9 failed" title="51 completed, 9 failed of 60"' in page
            assert '<span class="completed" style="width: 85.00%" title="completed: 51"></span>' in page
            assert '<span class="failed" style="width: 15.00%" title="failed: 9"></span>' in page


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        (f"/jobs/{uuid.UUID(int=7)}", 404, f"no job has the id {uuid.UUID(int=7)}"),
        ("/jobs/not-a-job", 404, "&#39;not-a-job&#39; is not a job id"),
        ("/jobs?status=bogus", 400, "unknown status &#39;bogus&#39;: one of queued, running"),
        ("/no-such-page", 404, "There is no page at this address."),
    ],
)
async def test_error_pages_are_pages_of_the_dashboard(asgi: Any, path: str, status: int, message: str) -> None:
    async with client(asgi) as http:
        response = await http.get(path)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["x-frame-options"] == "DENY" and response.headers["cache-control"] == "no-store"
    page = response.text
    assert message in page and '<p class="flash bad" role="alert">' in page
    assert "<nav>" in page and 'href="/jobs"' in page  # the layout, with its navigation
    assert "data-events" not in page  # nothing on it to refresh


async def test_without_a_session_an_error_shows_nothing_of_the_dashboard(dsn: str) -> None:
    asgi = create_app(jobbus.App(dsn=dsn), token="s3cret")
    try:
        async with client(asgi) as http:
            response = await http.get("/no-such-page")
            assert response.status_code == 404 and "<nav>" not in response.text
            response = await http.get(f"/jobs/{uuid.UUID(int=7)}", headers={"authorization": "Bearer s3cret"})
            assert response.status_code == 404 and "<nav>" in response.text
    finally:
        await asgi.state.dashboard.close()


async def test_the_login_page_has_no_navigation_live_dot_or_event_stream(dsn: str) -> None:
    asgi = create_app(jobbus.App(dsn=dsn), token="s3cret")
    try:
        async with client(asgi) as http:
            response = await http.get("/login?next=/jobs")
            assert response.status_code == 200
            page = response.text
            assert 'name="token"' in page
            assert "<nav>" not in page and 'id="live"' not in page and "/events" not in page
            csrf = re.search(r'value="([0-9a-f]{64})"', page)
            assert csrf is not None
            wrong = await http.post("/login", data={"csrf": csrf.group(1), "token": "x"})
            assert wrong.status_code == 401 and "wrong token" in wrong.text
            assert "<nav>" not in wrong.text and "/events" not in wrong.text
    finally:
        await asgi.state.dashboard.close()
