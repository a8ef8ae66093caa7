"""The jobs page's tag filter and bulk edit in headless Chromium: the tags on the rows, the confirmation
that names how many jobs a change touches before anything changes, and the change itself."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from tests.browser.conftest import Processes, screenshot


def _queues(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT queue, priority, count(*) FROM jobbus.job GROUP BY 1, 2 ORDER BY 1, 2").fetchall()


@pytest.mark.browser(slice=True)
def test_bulk_edit_of_a_tag_filter_confirms_the_count_then_moves_the_jobs(
    dsn: str, processes: Processes, page: Any
) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        app.sync.schedule_many(
            "mail.send", [{"to": f"u{n}@example.com"} for n in range(40)], queue="mail", tags=["campaign:spring"]
        )
        app.sync.schedule_many("mail.send", [{"to": "other@example.com"}] * 5, queue="mail")
        app.sync.schedule("report.render", {}, tags=["campaign:spring"], available_at=timedelta(hours=1))
    url = processes.dashboard()
    page.goto(f"{url}/jobs?status=queued&queue=mail&tag=campaign:spring")
    assert page.locator("tr[data-job]").count() == 40
    assert page.locator("td.tags a.tag").first.inner_text() == "campaign:spring"
    page.fill("input[name=set_priority]", "7")
    page.fill("input[name=set_queue]", "mail-slow")
    screenshot(page, "jobs-bulk-edit")
    page.get_by_role("button", name="Change every queued job of this filter…").click()
    page.wait_for_selector("p.confirm-count")
    assert (
        "This changes 40 queued jobs of queue mail with tags campaign:spring"
        in page.locator("p.confirm-count").inner_text()
    )
    assert "move to queue mail-slow" in page.locator("ul.confirm-changes").inner_text()
    screenshot(page, "jobs-bulk-edit-confirm")
    assert _queues(dsn) == [("default", 0, 1), ("mail", 0, 45)]  # nothing changed before the confirmation
    page.get_by_role("button", name="Change 40 job(s)").click()
    page.wait_for_selector("p.flash")
    assert "changed 40 queued job(s)" in page.locator("p.flash").inner_text()
    assert _queues(dsn) == [("default", 0, 1), ("mail", 0, 5), ("mail-slow", 7, 40)]
    # The selection: two rows checked, a start in two hours.
    page.goto(f"{url}/jobs?status=queued&queue=mail")
    boxes = page.locator("tr[data-job] input[name=ids]")
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.fill("input[name=set_available_at]", "2h")
    page.get_by_role("button", name="Change selected…").click()
    page.wait_for_selector("p.confirm-count")
    assert "This changes 2 of the 2 selected jobs (those still queued)" in page.locator("p.confirm-count").inner_text()
    page.get_by_role("button", name="Change 2 job(s)").click()
    page.wait_for_selector("p.flash")
    assert "changed 2 of 2 selected job(s)" in page.locator("p.flash").inner_text()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobbus.job WHERE queue = 'mail' AND available_at > now() + interval '1 hour'"
        ).fetchone()
    assert row == (2,)
    assert page.errors == []
