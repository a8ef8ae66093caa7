"""The dashboard in headless Chromium against real worker processes: pages, actions, live updates."""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect

import jobbus
from tests.browser.conftest import Processes, screenshot
from tests.processes import status_of, wait_until

PAGES = {
    "overview": "/",
    "jobs": "/jobs",
    "failures": "/failures",
    "workers": "/workers",
    "queues": "/queues",
    "periodic": "/periodic",
    "groups": "/groups",
}


def producer(dsn: str) -> jobbus.App:
    return jobbus.App(dsn=dsn)


def seed(dsn: str) -> dict[str, Any]:
    """What a small live system holds: work in two queues, failures, a group, a periodic job."""
    app = producer(dsn)
    group = uuid.uuid4()
    with app.sync:
        done = app.sync.schedule_many("ok", [{"to": f"user{n}@example.com"} for n in range(12)], queue="mail")
        app.sync.schedule_many("flaky", [{} for _ in range(3)], queue="mail", group_id=group)
        failed = app.sync.schedule_many("broken", [{"report": n} for n in range(4)], queue="reports", max_attempts=1)
        later = app.sync.schedule_many("ok", [{} for _ in range(3)], queue="mail", available_at=timedelta(hours=2))
        app.sync.add_periodic("nightly-report", type="ok", cron="0 3 * * *", queue="mail")
    with psycopg.connect(dsn, autocommit=True) as conn:  # an hour of history for the charts
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled, oldest_available_seconds) "
            "SELECT now() - make_interval(secs => 60 + 10 * s), q, (40 + 30 * sin(s / 40.0))::int, 3, 4, "
            "(20 + 15 * cos(s / 25.0))::int, (s % 17 = 0)::int * 3, 0, 2 + 8 * abs(sin(s / 30.0)) "
            "FROM generate_series(0, 350) AS s, unnest(ARRAY['mail', 'reports']) AS q"
        )
    return {"done": done, "failed": failed, "later": later, "group": group}


def settled(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobbus.job WHERE status = 'running' OR (status = 'queued' AND available_at <= now())"
        ).fetchone()
    return row is not None and row[0] == 0


def visit(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state("load")


def wait_for_live(page: Any) -> None:
    page.wait_for_selector("#live.on")


@pytest.mark.browser(slice=True)
def test_every_page_renders_without_console_errors(dsn: str, processes: Processes, page: Any) -> None:
    data = seed(dsn)
    processes.worker("--worker-id", "worker-a", "--concurrency", "4")
    url = processes.dashboard()
    wait_until(lambda: settled(dsn), what="the seeded jobs to run")
    wait_until(lambda: status_of(dsn, data["failed"][0]) == "failed", what="the failures")
    pages = {**PAGES, "job": f"/jobs/{data['failed'][0]}", "group": f"/groups/{data['group']}"}
    for name, path in pages.items():
        visit(page, url + path)
        assert page.locator("main h1").count() == 1, name
        wait_for_live(page)
        screenshot(page, name)
    assert page.errors == []
    visit(page, url + "/failures")
    assert page.locator("tr[data-pattern]").count() == 1
    assert "ReportMissingError" in page.locator("table.failures").inner_text()


@pytest.mark.browser(slice=True)
def test_a_job_completed_by_a_worker_appears_without_a_reload(dsn: str, processes: Processes, page: Any) -> None:
    app = producer(dsn)
    with app.sync:
        job_id = app.sync.schedule("ok", {"to": "late@example.com", "sleep": 1.0}, queue="mail")
    url = processes.dashboard()
    visit(page, f"{url}/jobs/{job_id}")
    wait_for_live(page)
    assert page.locator("h1 .status").inner_text() == "queued"
    page.evaluate("window.__notReloaded = true")
    processes.worker("--worker-id", "worker-live")
    page.wait_for_selector("h1 .status.completed", timeout=30_000)
    assert page.evaluate("window.__notReloaded") is True
    assert "late@example.com" in page.locator("main").inner_text()
    # The jobs list follows too.
    visit(page, f"{url}/jobs?status=completed")
    wait_for_live(page)
    with app.sync:
        second = app.sync.schedule("ok", {}, queue="mail")
    page.wait_for_selector(f'tr[data-job="{second}"]', timeout=30_000)
    assert page.errors == []


@pytest.mark.browser
def test_retry_a_failed_job(dsn: str, processes: Processes, page: Any) -> None:
    app = producer(dsn)
    with app.sync:
        job_id = app.sync.schedule("broken", {"report": 9}, queue="reports", max_attempts=1)
    processes.worker("--worker-id", "worker-retry")
    url = processes.dashboard()
    wait_until(lambda: status_of(dsn, job_id) == "failed", what="the failure")
    visit(page, f"{url}/jobs/{job_id}")
    assert page.locator("table.history tbody tr").count() == 1
    page.get_by_role("button", name="Retry").click()
    page.wait_for_selector("p.flash")
    assert "queued again" in page.locator("p.flash").inner_text()
    wait_for_live(page)
    # The first attempt, the manual retry (an entry of its own), the second attempt.
    expect(page.locator("table.history tbody tr")).to_have_count(3, timeout=30_000)
    assert "manually_retried" in page.locator("table.history tbody tr").nth(1).inner_text()
    expect(page.locator("h1 .status")).to_have_text("failed", timeout=30_000)
    assert page.errors == []


@pytest.mark.browser
def test_cancel_a_running_job(dsn: str, processes: Processes, page: Any) -> None:
    app = producer(dsn)
    with app.sync:
        job_id = app.sync.schedule("slow", {"seconds": 120}, queue="reports")
    processes.worker("--worker-id", "worker-cancel")
    url = processes.dashboard()
    wait_until(lambda: status_of(dsn, job_id) == "running", what="the job to start")
    visit(page, f"{url}/jobs/{job_id}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel").click()
    page.wait_for_selector("p.flash")
    assert "cancellation requested" in page.locator("p.flash").inner_text()
    wait_for_live(page)
    page.wait_for_selector("h1 .status.cancelled", timeout=30_000)
    assert status_of(dsn, job_id) == "cancelled"
    assert page.errors == []


@pytest.mark.browser
def test_pause_and_resume_a_queue(dsn: str, processes: Processes, page: Any) -> None:
    app = producer(dsn)
    with app.sync:
        app.sync.schedule("ok", {}, queue="mail", available_at=timedelta(hours=1))  # keeps the queue sampled
    processes.worker("--worker-id", "worker-queues")
    url = processes.dashboard()
    visit(page, f"{url}/queues")
    row = page.locator('table.queues tr[data-queue="mail"]')
    row.wait_for()
    row.get_by_role("button", name="Pause").click()
    page.wait_for_selector('table.queues tr[data-queue="mail"] .status.paused')
    with app.sync:
        job_id = app.sync.schedule("ok", {}, queue="mail")
    wait_until(lambda: status_of(dsn, job_id) == "queued", what="a queued job")
    import time

    time.sleep(1.5)  # several poll intervals: a paused queue is not claimed from
    assert status_of(dsn, job_id) == "queued"
    page.locator('table.queues tr[data-queue="mail"]').get_by_role("button", name="Resume").click()
    wait_until(lambda: status_of(dsn, job_id) == "completed", what="the job to run after resume")
    assert page.errors == []


@pytest.mark.browser
def test_drain_a_worker_and_see_its_acknowledgement(dsn: str, processes: Processes, page: Any) -> None:
    page.on("dialog", lambda dialog: dialog.accept())  # drain asks first
    processes.worker("--worker-id", "worker-stays")
    draining = processes.worker("--worker-id", "worker-drains")
    url = processes.dashboard()
    visit(page, f"{url}/workers")
    row = page.locator('tr[data-worker="worker-drains"]')
    row.wait_for(timeout=30_000)
    row.get_by_role("button", name="Drain").click()
    page.wait_for_selector("p.flash")
    assert "drain sent to worker worker-drains" in page.locator("p.flash").inner_text()
    wait_for_live(page)
    command = page.locator("table.commands tbody tr").first
    expect(page.locator("table.commands tbody tr").first.locator(".acked")).to_contain_text(
        "worker-drains", timeout=30_000
    )
    assert re.search(r"drain\s+worker worker-drains", command.inner_text())
    assert draining.wait(timeout=30) == 0
    page.wait_for_selector('tr[data-worker="worker-drains"] .status.stopped', timeout=30_000)
    screenshot(page, "workers-after-drain")
    assert page.errors == []


@pytest.mark.browser
def test_login_with_a_token(dsn: str, processes: Processes, page: Any) -> None:
    url = processes.dashboard("--token", "browser-s3cret")
    visit(page, f"{url}/queues")
    assert page.url.startswith(f"{url}/login")
    screenshot(page, "login")
    page.fill("input[name=token]", "wrong")
    page.get_by_role("button", name="Log in").click()
    assert page.locator("p.flash.bad").inner_text() == "wrong token"
    page.fill("input[name=token]", "browser-s3cret")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/queues")
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["jobbus_session"]["httpOnly"] and cookies["jobbus_session"]["sameSite"] == "Strict"
    assert "browser-s3cret" not in cookies["jobbus_session"]["value"]
    wait_for_live(page)
    assert [e for e in page.errors if "401" not in e] == []


@pytest.mark.browser
def test_log_out_with_the_button(dsn: str, processes: Processes, page: Any) -> None:
    url = processes.dashboard("--token", "browser-s3cret")
    visit(page, f"{url}/login")
    page.fill("input[name=token]", "browser-s3cret")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")
    page.get_by_role("button", name="log out").click()
    page.wait_for_url(f"{url}/login")
    assert "jobbus_session" not in {c["name"] for c in page.context.cookies()}
    visit(page, f"{url}/queues")
    assert page.url.startswith(f"{url}/login")


@pytest.mark.browser
def test_set_the_limits_of_a_queue_whose_name_has_a_slash(dsn: str, processes: Processes, page: Any) -> None:
    """What the operator typed survives the live refreshes that land before Set is pressed."""
    app = producer(dsn)
    with app.sync:
        app.sync.schedule("ok", {}, queue="mail/eu", available_at=timedelta(hours=1))  # keeps the queue sampled
        app.sync.set_queue("mail/eu", rate_limit=jobbus.RateLimit(10, timedelta(minutes=1)))
    processes.worker("--worker-id", "worker-limits", "--queue", "mail/eu")
    url = processes.dashboard()
    visit(page, f"{url}/queues")
    wait_for_live(page)
    row = page.locator('table.limits tr[data-queue="mail/eu"]')
    row.wait_for(timeout=30_000)
    row.locator("input[name=concurrency]").fill("3")
    page.locator("h1").first.click()  # the field loses the focus; the typed value is not sent yet
    with app.sync:  # changes the page would refresh on, twice a second (the worker samples every 0.5 s)
        app.sync.schedule_many("ok", [{} for _ in range(5)], queue="mail/eu")
    time.sleep(3)
    assert row.locator("input[name=concurrency]").input_value() == "3"
    row.get_by_role("button", name="Set").click()
    page.wait_for_selector("p.flash")
    assert "queue mail/eu: concurrency 3, rate 10/60s" in page.locator("p.flash").inner_text()
    with app.sync:
        limits = app.sync.get_queue("mail/eu")
    assert (limits.concurrency, limits.rate_limit) == (3, jobbus.RateLimit(10, timedelta(minutes=1)))
    assert page.errors == []


@pytest.mark.browser(slice=True)
def test_stale_counts_work_nobody_takes_and_an_attempts_traceback(dsn: str, processes: Processes, page: Any) -> None:
    app = producer(dsn)
    with app.sync:
        app.sync.schedule_many("ok", [{} for _ in range(5)], queue="mail")
        job_id = app.sync.schedule("broken", {"report": 7}, queue="reports", max_attempts=1)
    url = processes.dashboard()
    # No worker: no sample for the charts, which the overview says; the counts are read now anyway, and
    # nobody can take the jobs.
    visit(page, url + "/")
    wait_for_live(page)
    cards = page.locator("section.cards").inner_text()
    assert "6 available" in cards
    assert "none yet: is a worker running?" in page.locator("main").inner_text()
    nobody = page.locator("section.notice.unhandled").inner_text()
    assert "5 of type ok in queue mail" in nobody and "no worker is alive" in nobody
    screenshot(page, "overview-stale")
    visit(page, url + "/queues")
    assert page.locator('tr[data-queue="mail"] td.num').first.inner_text() == "5"
    screenshot(page, "queues-stale")
    # A worker fails the job: its attempt's traceback is on the job page, folded until opened.
    processes.worker("--worker-id", "worker-trace")
    wait_until(lambda: status_of(dsn, job_id) == "failed", what="the failure")
    visit(page, f"{url}/jobs/{job_id}")
    details = page.locator("table.history details.traceback")
    expect(details).to_have_count(1)
    assert not details.locator("pre").is_visible()
    details.locator("summary").click()
    trace = details.locator("pre")
    expect(trace).to_be_visible()
    assert "Traceback (most recent call last)" in trace.inner_text()
    assert "ReportMissingError: report 7 is missing" in trace.inner_text()
    # A live refresh keeps it open.
    wait_for_live(page)
    page.evaluate("document.getElementById('main').addEventListener('jobbus:refreshed', () => window.__refreshed = 1)")
    with app.sync:
        app.sync.schedule("ok", {}, queue="mail")
    wait_until(lambda: page.evaluate("window.__refreshed === 1"), what="a live refresh")
    expect(page.locator("table.history details.traceback pre")).to_be_visible()
    screenshot(page, "job-traceback")
    assert page.errors == []
