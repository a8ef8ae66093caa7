"""A job's logs on its page in headless Chromium: each attempt's lines, folded until opened, shown as
text (a hostile message is never markup) and masked."""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import jobbus
from jobbus.redaction import MASK
from tests.browser.conftest import Processes, screenshot

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"> token=s3cr3t'


async def _run_logging_job(dsn: str) -> str:
    app = jobbus.App(dsn=dsn, retry_base_delay_seconds=0, retry_max_delay_seconds=0)

    @app.job("import.orders")
    async def import_orders(job: jobbus.JobExecution) -> None:
        job.logger.info("fetching orders, attempt %d", job.attempt)
        logging.getLogger("shop.import").warning(HOSTILE)
        if job.attempt == 1:
            raise RuntimeError("the shop's API timed out")

    async with app:
        job_id = await app.schedule("import.orders", max_attempts=2)
        logging.getLogger("jobbus.job").setLevel(logging.INFO)
        await jobbus.Worker(app, stop_when_empty=True, concurrency=1).run()
    return str(job_id)


@pytest.mark.browser(slice=True)
def test_a_jobs_page_shows_each_attempts_logs_escaped(dsn: str, processes: Processes, page: Any) -> None:
    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's event loop
        job_id = thread.submit(asyncio.run, _run_logging_job(dsn)).result()
    url = processes.dashboard()
    page.goto(f"{url}/jobs/{job_id}")
    logs = page.locator("table.history details.logs")
    assert logs.count() == 2  # one per attempt
    assert logs.first.locator("summary").inner_text() == "logs (2 lines)"
    for n in range(2):
        logs.nth(n).locator("summary").click()
        rows = logs.nth(n).locator("table.logs tr")
        assert rows.count() == 2
        assert rows.nth(0).locator("td.level").inner_text() == "INFO"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", rows.nth(0).locator("td.when").inner_text())
        assert rows.nth(0).locator("pre").inner_text() == f"fetching orders, attempt {n + 1}"
        assert rows.nth(1).locator("td.level").inner_text() == "WARNING"
        assert rows.nth(1).locator("pre").inner_text() == HOSTILE.replace("s3cr3t", MASK)
    assert page.evaluate("window.pwned === undefined")
    assert page.locator("table.logs img").count() == 0 and page.locator("table.logs script").count() == 0
    screenshot(page, "job-logs")
