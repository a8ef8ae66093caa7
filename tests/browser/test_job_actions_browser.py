"""Delete, run now, the views' tabs and the confirmations of destructive buttons, in headless Chromium."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from tests.browser.conftest import Processes, screenshot
from tests.processes import wait_until


def _answer(messages: list[str], accept: bool) -> Any:
    """A dialog handler that records the dialog's message, then accepts or dismisses it."""

    def handle(dialog: Any) -> None:
        messages.append(dialog.message)
        if accept:
            dialog.accept()
        else:
            dialog.dismiss()

    return handle


def _exists(dsn: str, job_id: Any) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM jobbus.job WHERE id = %s", (job_id,)).fetchone() is not None


@pytest.mark.browser
def test_run_now_and_delete_from_the_job_page(dsn: str, processes: Processes, page: Any) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        later = app.sync.schedule("ok", {"to": "later@example.com"}, queue="mail", available_at=timedelta(hours=2))
    url = processes.dashboard()
    page.goto(f"{url}/jobs/{later}")
    screenshot(page, "job-queued-actions")
    page.get_by_role("button", name="Run now").click()
    page.wait_for_selector("p.flash")
    assert "available now" in page.locator("p.flash").inner_text()
    # Delete asks first: dismissed, nothing happens; accepted, the job goes and the list is shown.
    messages: list[str] = []
    page.once("dialog", _answer(messages, accept=False))
    page.get_by_role("button", name="Delete").click()
    assert messages and "cannot be undone" in messages[0]
    assert _exists(dsn, later)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete").click()
    page.wait_for_selector("p.flash")
    assert "deleted" in page.locator("p.flash").inner_text()
    assert page.url.endswith("/jobs")
    assert not _exists(dsn, later)
    assert page.errors == []


@pytest.mark.browser
def test_tabs_views_and_bulk_delete_with_confirmation(dsn: str, processes: Processes, page: Any) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        later = app.sync.schedule_many(
            "ok", [{"n": n} for n in range(3)], queue="mail", available_at=timedelta(hours=2)
        )
        app.sync.schedule_many("ok", [{"n": n} for n in range(2)], queue="reports")
    url = processes.dashboard()
    page.goto(f"{url}/jobs")
    assert page.locator('[data-tab="queued"] .count').inner_text() == "5"
    assert page.locator('[data-tab="scheduled"] .count').inner_text() == "3"
    screenshot(page, "jobs-tabs")
    page.locator('[data-tab="scheduled"]').click()
    page.wait_for_selector('[data-tab="scheduled"][aria-current="page"]')
    assert page.locator("tr[data-job]").count() == 3
    page.locator("[data-select-all]").check()
    asked: list[str] = []
    page.once("dialog", _answer(asked, accept=True))
    page.get_by_role("button", name="Delete selected").click()
    page.wait_for_selector("p.flash")
    assert asked == ["Delete the selected jobs? This cannot be undone."]
    assert "delete: 3 of 3" in page.locator("p.flash").inner_text()
    wait_until(lambda: not any(_exists(dsn, i) for i in later), what="the deleted jobs to go")
    screenshot(page, "jobs-after-bulk-delete")
    assert page.errors == []


@pytest.mark.browser
def test_the_jobs_page_at_390_pixels_and_in_the_dark(dsn: str, processes: Processes, browser: Any) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        ids = app.sync.schedule_many("ok", [{"n": n} for n in range(3)], queue="mail", available_at=timedelta(hours=2))
    url = processes.dashboard()
    screens: dict[str, tuple[int, str]] = {"jobs-390px": (390, "light"), "jobs-dark": (1280, "dark")}
    for name, (width, scheme) in screens.items():
        context = browser.new_context(viewport={"width": width, "height": 860}, color_scheme=scheme)
        tab = context.new_page()
        tab.goto(f"{url}/jobs")
        screenshot(tab, name)
        # Nothing wider than the screen: wide tables scroll inside the page.
        assert tab.evaluate("document.documentElement.scrollWidth") <= width, name
        tab.goto(f"{url}/jobs/{ids[0]}")
        screenshot(tab, name.replace("jobs", "job"))
        assert tab.evaluate("document.documentElement.scrollWidth") <= width, name
        context.close()
