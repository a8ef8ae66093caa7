"""A workflow on the job page, the groups' stacked bar, folded failures, an error page, the login page
and the page of a database without the schema, in headless Chromium against real dashboard and worker
processes."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect

import jobbus
from jobbus import schema
from tests.browser.conftest import Processes, screenshot
from tests.processes import query, wait_until


def parked(dsn: str, job_id: uuid.UUID) -> bool:
    rows = query(dsn, "SELECT status, history -> -1 ->> 'outcome' FROM jobbus.job WHERE id = %s", (job_id,))
    return rows[0] == ("queued", "waiting")


@pytest.mark.browser
def test_a_workflow_on_the_job_page(dsn: str, processes: Processes, page: Any) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        parent = app.sync.schedule("flow", {"children": 3, "child_sleep": 8}, queue="flows")
    processes.worker("--worker-id", "worker-flow", "--concurrency", "4")
    url = processes.dashboard()
    wait_until(lambda: parked(dsn, parent), what="the parent to park in wait_for_children")
    page.goto(f"{url}/jobs/{parent}")
    # Parked: the attempts row says what it waits for; its step and its children are listed.
    expect(page.locator("table.history span.reason")).to_have_text(re.compile(r"waiting for [1-3] child(ren)?$"))
    expect(page.locator("table.steps tr[data-step]")).to_have_count(1)
    assert (
        "fetch" in page.locator("table.steps").inner_text()
        and '{"rows": 12}' in page.locator("table.steps").inner_text()
    )
    expect(page.locator("table.children tr[data-child]")).to_have_count(3)
    screenshot(page, "job-workflow-waiting")
    # The children end, the parent runs again and completes: the open page follows without a reload.
    page.wait_for_selector("h1 .status.completed", timeout=60_000)
    expect(page.locator("table.children .status.completed")).to_have_count(3)
    screenshot(page, "job-workflow")
    # A child links its parent.
    page.locator("table.children a").first.click()
    page.wait_for_selector("a.parent")
    assert page.locator("a.parent").inner_text() == str(parent)
    page.locator("a.parent").click()
    page.wait_for_selector("table.children")
    assert page.errors == []


def seed_groups(dsn: str) -> uuid.UUID:
    """A group of 60 with 9 failed, and one with every part of the bar."""
    app = jobbus.App(dsn=dsn)
    nine, mixed = uuid.uuid4(), uuid.uuid4()
    with app.sync:
        ids = app.sync.schedule_many("report", [{"n": n} for n in range(60)], queue="reports", group_id=nine)
        other = app.sync.schedule_many("report", [{"n": n} for n in range(20)], queue="reports", group_id=mixed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for status, chosen in [
            ("completed", ids[:51] + other[:8]),
            ("failed", ids[51:] + other[8:11]),
            ("cancelled", other[11:14]),
        ]:
            conn.execute("UPDATE jobbus.job SET status = %s, finished_at = now() WHERE id = ANY(%s)", (status, chosen))
    return nine


@pytest.mark.browser
def test_the_groups_bar_shows_failures_in_light_dark_and_at_390_pixels(
    dsn: str, processes: Processes, browser: Any
) -> None:
    nine = seed_groups(dsn)
    url = processes.dashboard()
    screens = {"groups": (1280, "light"), "groups-390px": (390, "light"), "groups-dark": (1280, "dark")}
    for name, (width, scheme) in screens.items():
        context = browser.new_context(viewport={"width": width, "height": 700}, color_scheme=scheme)
        tab = context.new_page()
        errors: list[str] = []
        tab.on(
            "console", lambda message, errors=errors: errors.append(message.text) if message.type == "error" else None
        )
        tab.goto(f"{url}/groups")
        bar = tab.locator(f'tr[data-group="{nine}"] .stack')
        assert bar.get_attribute("title") == "51 completed, 9 failed of 60"
        # Found and measured in one turn of the page's script, retried until laid out: a live refresh may
        # replace the row between two calls, and a replaced element has no box and an empty style.
        failed_width, bar_width, red = tab.wait_for_function(
            """selector => { const e = document.querySelector(selector); const f = e && e.querySelector('.failed');
                 if (!f || !e.isConnected) return null;
                 const w = e.getBoundingClientRect().width, fw = f.getBoundingClientRect().width;
                 return w > 0 && fw > 0 ? [fw, w, getComputedStyle(f).backgroundColor] : null; }""",
            arg=f'tr[data-group="{nine}"] .stack',
        ).json_value()
        share = failed_width / bar_width
        assert 0.13 < share < 0.17, (name, share)
        r, g, b = map(int, re.findall(r"\d+", red)[:3])
        assert r > 180 and g < 140 and b < 140, (name, red)  # red in both schemes
        screenshot(tab, name)
        assert tab.evaluate("document.documentElement.scrollWidth") <= width, name
        tab.goto(f"{url}/groups/{nine}")
        expect(tab.locator(".stack.wide .failed")).to_have_attribute("title", "failed: 9")
        screenshot(tab, name.replace("groups", "group"))
        assert tab.evaluate("document.documentElement.scrollWidth") <= width, name
        assert errors == [], name
        context.close()


@pytest.mark.browser
def test_failures_fold_into_groups(dsn: str, processes: Processes, page: Any) -> None:
    app = jobbus.App(dsn=dsn)
    errors = [f"app.NotFound: user {n} not found" for n in (17, 204, 3051)]
    errors += [f"KeyError: '{key}'" for key in ("invoice", "customer")]
    errors += [f"app.Bounce: mail to {who}@example.com bounced (550)" for who in ("ann", "bob", "eve", "joe")]
    errors += [f"app.Gone: job {uuid.uuid4()} is gone" for _ in range(2)]
    with app.sync:
        ids = app.sync.schedule_many("report", [{"n": n} for n in range(len(errors))], queue="reports")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job_id, error in zip(ids, errors, strict=True):
            conn.execute(
                "UPDATE jobbus.job SET status = 'failed', finished_at = now(), last_error = %s WHERE id = %s",
                (error, job_id),
            )
    url = processes.dashboard()
    page.goto(f"{url}/failures")
    expect(page.locator("tr[data-pattern]")).to_have_count(4)
    assert "mail to <email> bounced (<n>)" in page.locator("table.failures").inner_text()
    screenshot(page, "failures")
    assert page.errors == []


@pytest.mark.browser
def test_an_error_page_and_the_login_page(dsn: str, processes: Processes, page: Any) -> None:
    url = processes.dashboard("--token", "browser-s3cret")
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    missing = uuid.UUID(int=42)
    page.goto(f"{url}/jobs/{missing}")
    assert page.url.startswith(f"{url}/login")
    expect(page.locator("input[name=token]")).to_be_visible()
    assert page.locator("nav").count() == 0 and page.locator("#live").count() == 0
    page.wait_for_timeout(1500)  # time enough for a stream to be opened, if anything opened one
    assert not [u for u in requested if "/events" in u]
    screenshot(page, "login")
    page.fill("input[name=token]", "browser-s3cret")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/jobs/{missing}")
    expect(page.locator("main h1")).to_contain_text("Not Found")
    assert f"no job has the id {missing}" in page.locator("p.flash.bad").inner_text()
    expect(page.locator('nav a[aria-current="page"]')).to_have_text("Jobs")
    screenshot(page, "error-404")
    page.goto(f"{url}/jobs?status=bogus")
    expect(page.locator("main h1")).to_contain_text("Bad Request")
    assert "unknown status 'bogus'" in page.locator("p.flash.bad").inner_text()
    # The browser reports the page's own status (404, 400) as a failed load; nothing else went wrong.
    assert [e for e in page.errors if not re.search(r"status of 40[04]", e)] == []


@pytest.mark.browser(slice=True)
def test_a_database_without_the_schema_gets_a_page_saying_to_migrate(empty_dsn: str, page: Any) -> None:
    processes = Processes(empty_dsn)
    try:
        url = processes.dashboard()
        page.goto(f"{url}/jobs")
        expect(page.locator("main h1")).to_contain_text("Schema not ready")
        assert "schema jobbus is missing: run `jobbus migrate`" in page.locator("p.flash.bad").inner_text()
        expect(page.locator('nav a[aria-current="page"]')).to_have_text("Jobs")
        screenshot(page, "schema-missing")
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        page.reload()
        expect(page.locator("main h1")).to_contain_text("Jobs")
        page.wait_for_selector("#live.on")
    finally:
        log = processes.procs[0].stdout
        processes.stop()
    output = log.read() if log is not None else ""
    assert "Traceback" not in output, output
    assert "schema jobbus is missing: run `jobbus migrate`" in output
    # The browser reports the page's own status (503) as a failed load; nothing else went wrong.
    assert [e for e in page.errors if not re.search(r"status of 503", e)] == []
