"""The dashboard over cells in Chromium: the overview of every cell (one of them down), the cell switcher
in the navigation, each cell's jobs, an action in one cell."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus.dashboard import create_app
from tests.browser.conftest import screenshot
from tests.browser.test_dashboard_browser import visit, wait_for_live
from tests.contrib.servers import served
from tests.observability.cells import cell_databases, cells_app, unreachable_dsn


@pytest.fixture
def cells(admin_dsn: str, template_db: str) -> Iterator[dict[str, str]]:
    with cell_databases(admin_dsn, template_db, ["eu", "us"]) as dsns:
        yield dsns


def seed(cells: dict[str, str]) -> None:
    """eu: invoices, one failed; us: reports and mail."""
    for name, jobs in (
        ("eu", [("invoice.render", "billing", 4)]),
        ("us", [("report.build", "reports", 3), ("mail.send", "mail", 2)]),
    ):
        app = jobbus.App(dsn=cells[name])
        with app.sync:
            for job_type, queue, n in jobs:
                app.sync.schedule_many(job_type, [{"cell": name, "n": i} for i in range(n)], queue=queue)
    with psycopg.connect(cells["eu"], autocommit=True) as conn:
        conn.execute(
            "UPDATE jobbus.job SET status = 'failed', attempts = 3, finished_at = now(), last_error = "
            "'TemplateMissingError: invoice template gone' WHERE id = (SELECT id FROM jobbus.job ORDER BY id LIMIT 1)"
        )


@pytest.mark.browser(slice=True)
def test_switching_cells_from_the_navigation_shows_each_cells_jobs(cells: dict[str, str], page: Any) -> None:
    seed(cells)
    asgi = create_app(cells_app({"eu": cells["eu"], "us": cells["us"], "apac": unreachable_dsn()}))
    with served(asgi, cleanup=asgi.state.dashboard.close) as url:
        visit(page, url + "/")
        wait_for_live(page)
        parts = page.locator("section.cell")
        assert parts.count() == 3
        assert "cannot be reached" in page.locator('section[data-cell="apac"]').inner_text()
        assert "Connection refused" in page.locator('section[data-cell="apac"] .flash').inner_text()
        assert page.locator('section[data-cell="us"] tr[data-queue]').count() == 2
        screenshot(page, "cells-overview")
        page.set_viewport_size({"width": 390, "height": 844})  # a phone: the switcher and the cells inside
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        screenshot(page, "cells-overview-390px")
        page.set_viewport_size({"width": 1280, "height": 860})

        page.click('section[data-cell="eu"] .card a[href$="/jobs?status=failed"]')  # eu's failed jobs
        page.wait_for_url(re.compile(r"/cells/eu/jobs\?status=failed$"))
        assert page.locator("tr[data-job]").count() == 1
        visit(page, url + "/jobs")  # a page without a cell opens in the first cell
        assert page.url.endswith("/cells/eu/jobs")
        wait_for_live(page)
        assert page.locator('nav.cells a[aria-current="page"]').inner_text() == "eu"
        assert set(page.locator("tr[data-job] td:nth-child(5)").all_inner_texts()) == {"invoice.render"}

        page.click('nav.cells a[data-cell="us"]')
        page.wait_for_url(re.compile(r"/cells/us/jobs$"))
        wait_for_live(page)
        assert page.locator('nav.cells a[aria-current="page"]').inner_text() == "us"
        assert set(page.locator("tr[data-job] td:nth-child(5)").all_inner_texts()) == {"report.build", "mail.send"}
        assert page.locator('[data-tab="queued"] .count').inner_text() == "5"
        assert page.title() == "Jobs · cell us · jobbus"
        screenshot(page, "cells-us-jobs")

        # An action from us's page acts in us, and the page stays in us.
        page.locator("tr[data-job] input[name=ids]").first.check()
        page.once("dialog", lambda dialog: dialog.accept())
        page.click('button[value="cancel"]')
        page.wait_for_selector("p.flash")
        assert "cancel: 1 of 1 selected job(s)" in page.locator("p.flash").inner_text()
        assert re.search(r"/cells/us/jobs$", page.url)
        with psycopg.connect(cells["us"]) as conn:
            assert conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'cancelled'").fetchone() == (1,)
        with psycopg.connect(cells["eu"]) as conn:
            assert conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'cancelled'").fetchone() == (0,)

        page.click('nav.cells a[data-cell="apac"]')
        page.wait_for_url(re.compile(r"/cells/apac/jobs$"))
        assert page.locator("h1").inner_text().startswith("Cell apac cannot be reached")
        screenshot(page, "cells-apac-down")
        page.click('nav.cells a:text("all cells")')
        page.wait_for_url(url + "/")
        assert not [e for e in page.errors if "503" not in e], page.errors
