"""The overview's chart range switch and the jobs page's filter choices with counts, in Chromium."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.browser.conftest import Processes, screenshot
from tests.browser.test_dashboard_browser import seed, settled, visit, wait_for_live
from tests.processes import wait_until


def seed_a_week(dsn: str) -> None:
    """A week of samples as the leader keeps them once they are an hour old (one row per queue and 10
    minutes), and of jobs that finished over it (one an hour, one in ten failed)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, attempts, status, started_at, finished_at)"
            " SELECT gen_random_uuid(), 'ok', 'mail', 3, 1, CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'completed' END,"
            " now() - n * interval '1 hour', now() - n * interval '1 hour' FROM generate_series(2, 160) AS n"
        )
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled, oldest_available_seconds) "
            "SELECT now() - make_interval(mins => 65 + 10 * s), q, (30 + 25 * sin(s / 50.0))::int, 2, 3, "
            "(600 + 400 * sin(s / 70.0))::int, (s % 23 = 0)::int * 40, 0, 5 + 20 * abs(sin(s / 90.0)) "
            "FROM generate_series(0, 6 * 24 * 7 - 8) AS s, unnest(ARRAY['mail', 'reports']) AS q"
        )


def totals(page: Any) -> dict[str, str]:
    return {name: page.locator(f'dd[data-total="{name}"]').inner_text() for name in ("processed", "failed")}


@pytest.mark.browser
def test_the_chart_range_switch_and_the_jobs_filters_with_counts(dsn: str, processes: Processes, page: Any) -> None:
    seed(dsn)
    seed_a_week(dsn)
    processes.worker("--worker-id", "worker-a", "--concurrency", "4")
    url = processes.dashboard()
    wait_until(lambda: settled(dsn), what="the seeded jobs to run")

    visit(page, url + "/")
    wait_for_live(page)
    assert page.locator("main h2").first.inner_text() == "Last 1 h"
    assert page.locator('a[data-range="1h"]').get_attribute("aria-current") == "page"
    hour = totals(page)
    assert page.locator(".chart svg text.y").count() == 12  # a scale in each of the four charts
    assert re.fullmatch(r"\d\d:\d\d", page.locator(".chart svg text.x").first.text_content() or "")
    screenshot(page, "overview-range-1h")

    page.click('a[data-range="7d"]')
    page.wait_for_url(re.compile(r"range=7d"))
    wait_for_live(page)
    assert page.locator("main h2").first.inner_text() == "Last 7 d"
    week = totals(page)
    assert int(week["processed"].replace(",", "")) > int(hour["processed"].replace(",", ""))
    assert int(week["failed"].replace(",", "")) > 0
    days = page.locator(".chart.ok svg text.x").all_text_contents()
    assert len(days) >= 6 and all(re.fullmatch(r"[A-Z][a-z]{2} \d\d", day) for day in days)
    assert "Completed per hour" in page.locator(".charts").inner_text()
    screenshot(page, "overview-range-7d")

    page.click('a[data-range="24h"]')
    page.wait_for_url(re.compile(r"range=24h"))
    assert page.locator("main h2").first.inner_text() == "Last 24 h"
    assert "Completed per 10 min" in page.locator(".charts").inner_text()
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the charts one below the other, inside
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, "overview-range-24h-390px")
    page.set_viewport_size({"width": 1280, "height": 860})

    visit(page, url + "/jobs")
    wait_for_live(page)
    queues = page.locator('select[name="queue"] option').all_inner_texts()
    assert queues == ["any", "mail"], queues  # the queued tab's queues, every one (reports has none queued)
    visit(page, url + "/jobs?status=failed")
    assert page.locator('select[name="queue"] option').all_inner_texts() == ["any", "mail", "reports"]
    page.select_option('select[name="queue"]', "reports")
    page.click("form.filters button")
    page.wait_for_url(re.compile(r"queue=reports"))
    types = page.locator('select[name="type"] option').all_inner_texts()
    assert types == ["any", "broken"]  # only the types of the chosen queue
    assert page.locator('[data-tab="failed"] .count').inner_text() == "4"
    previews = page.locator("td.args code").all_inner_texts()
    assert previews and all(re.fullmatch(r'\{"report": \d\}', p) for p in previews), previews
    screenshot(page, "jobs-filter-choices")
    assert page.errors == []
