"""The Audit page in headless Chromium: actions of the dashboard, the command line and the Python API are
listed newest first, with their actor and source, and the page's text is escaped."""

from __future__ import annotations

import getpass
from datetime import timedelta
from typing import Any

import pytest

import jobbus
from tests.browser.conftest import Processes, screenshot
from tests.cli import jobbus as run_cli


@pytest.mark.browser(slice=True)
def test_the_audit_page_lists_the_actions_of_every_source(dsn: str, processes: Processes, page: Any) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        later = app.sync.schedule("ok", {"to": "later@example.com"}, queue="mail", available_at=timedelta(hours=2))
        other = app.sync.schedule("ok", {"to": "other@example.com"}, queue="mail")
        with jobbus.acting_as("<b>alice</b>", source="api"):
            app.sync.update(other, priority=5)
            app.sync.set_queue("mail", concurrency=4)
    paused = run_cli(dsn, "pause", "--queue", "reports")
    assert paused.returncode == 0, paused.stderr
    url = processes.dashboard()
    page.goto(f"{url}/jobs/{later}")
    page.get_by_role("button", name="Run now").click()
    page.wait_for_selector("p.flash")
    page.get_by_role("link", name="Audit").click()
    page.wait_for_selector("table.audit")
    rows = page.locator("table.audit tbody tr")
    assert rows.count() == 4
    first = [cell.inner_text() for cell in rows.nth(0).locator("td").all()]
    assert first[1:5] == ["anonymous", "dashboard", "run_now", f"job:{later}"]
    actors = [rows.nth(i).locator("td.actor").inner_text() for i in range(4)]
    assert actors == ["anonymous", getpass.getuser(), "<b>alice</b>", "<b>alice</b>"]  # text, not markup
    assert [rows.nth(i).locator("td").nth(2).inner_text() for i in range(4)] == ["dashboard", "cli", "api", "api"]
    assert page.locator("table.audit b").count() == 0
    assert [rows.nth(i).locator("td.action").inner_text() for i in range(4)] == [
        "run_now",
        "pause",
        "set_queue",
        "update",
    ]
    page.locator("table.audit td.target a").first.click()
    page.wait_for_url(f"**/jobs/{later}")
    page.go_back()
    page.wait_for_selector("table.audit")
    screenshot(page, "dashboard-audit")
    assert page.errors == []
