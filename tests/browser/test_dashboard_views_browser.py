"""The jobs page at a size where a window would have lied (the review's table: 20,000 scheduled an hour
ahead, 2,500 retrying, 2,000 failed, 18,000 queued of a type no worker handles, parked workflows), in a
real browser: every tab's first page is full, its count is the tab's, and a parked job says what it
waits for. Screenshots in artifacts/screenshots/."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.browser.conftest import Processes, screenshot
from tests.observability.test_dashboard_counts import FILL

MORE = [
    "INSERT INTO jobbus.job (id, type, queue, max_attempts, available_at)"
    " SELECT jobbus.uuid_generate_v7(), 'nobody.handles', 'default', 3, now() - n * interval '1 ms'"
    " FROM generate_series(1, 18000) AS n",
    "INSERT INTO jobbus.job (id, type, name, max_attempts, available_at, history) SELECT jobbus.uuid_generate_v7(),"
    " 'order.fulfil', 'order ' || n, 3, CASE WHEN n % 2 = 0 THEN now() + n * interval '1 min' ELSE '9000-01-01' END,"
    " jsonb_build_array(jsonb_build_object('attempt', 1, 'outcome', 'waiting', 'waiting_for',"
    " CASE WHEN n % 2 = 0 THEN 'sleep:cool-off' ELSE 'event order:' || n || ':paid' END))"
    " FROM generate_series(1, 300) AS n",
]


def _tab(page: Any, tab: str) -> str:
    return str(page.locator(f'[data-tab="{tab}"] .count').inner_text())


@pytest.mark.browser
def test_every_tab_is_complete_and_counted_at_the_size_of_the_review(dsn: str, processes: Processes, page: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in [*FILL, *MORE]:
            conn.execute(statement)
        conn.execute("ANALYZE jobbus.job")
    url = processes.dashboard()
    page.goto(f"{url}/jobs?status=scheduled")
    assert page.locator("tr[data-job]").count() == 50
    assert re.fullmatch(r"(≈|>) [\d,]+", _tab(page, "scheduled")), _tab(page, "scheduled")  # 20,000: an estimate
    assert _tab(page, "retrying") == "2,500" and _tab(page, "failed") == "2,000" and _tab(page, "waiting") == "300"
    assert page.locator("td.when").first.inner_text().startswith("runs in ")
    screenshot(page, "jobs-scheduled-20000")
    page.goto(f"{url}/jobs?status=retrying&q=SKU-2499")
    assert page.locator("tr[data-job]").count() == 1 and "sku-2499 busy" in page.locator("td.error").inner_text()
    # The other tabs' counts of a search are asked for once the page is shown, and filled in (a retrying
    # job is a queued one too).
    page.locator('[data-tab="failed"] .count:not([data-later])').wait_for()
    assert _tab(page, "failed") == "0" and _tab(page, "retrying") == "1" and _tab(page, "queued") == "1"
    page.goto(f"{url}/jobs?status=failed&q=user 1999 not found")
    assert page.locator("tr[data-job]").count() == 1 and _tab(page, "failed") == "1"
    assert "Searched without the search index" in page.locator("p.search-note").inner_text()
    screenshot(page, "jobs-search-without-index")
    page.goto(f"{url}/jobs?status=waiting")
    sleeps = page.locator("td.when").all_inner_texts()
    assert len(sleeps) == 50 and all(re.match(r"waits for sleep cool-off, until \d{4}-", w) for w in sleeps), sleeps[:3]
    screenshot(page, "jobs-waiting")
    page.goto(f"{url}/jobs?status=waiting&name=order%207")  # an event wait without a timeout: the end of the tab
    assert page.locator("td.when").all_inner_texts() == ["waits for event order:7:paid"]
    assert "9000" not in page.content()
    page.goto(f"{url}/failures")
    assert page.locator("h1 .count").inner_text() == "2,000"
    assert "Retry all 2,000" in page.locator("tr[data-pattern] button").inner_text()
    screenshot(page, "failures-2000")
    page.goto(f"{url}/")
    assert page.locator("tr[data-queue='mail'] td.num").nth(3).inner_text() == "2,000"
    screenshot(page, "overview-counts")
