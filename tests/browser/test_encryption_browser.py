"""Encrypted payloads on the dashboard in headless Chromium (SPEC 22): a dashboard holding the key shows
the configuration and the result, one without it a placeholder naming the key id and no ciphertext."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import jobbus
from jobbus.encryption import generate_key, key_id, parse_key
from tests.browser.conftest import Processes, screenshot


@pytest.mark.browser(slice=True)
def test_the_job_page_shows_encrypted_payloads_only_with_the_key(
    dsn: str, processes: Processes, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = generate_key()
    word = f"card-{uuid.uuid4().hex[:12]}"
    app = jobbus.App(dsn=dsn, encryption_keys=[key], retry_base_delay_seconds=0, poll_interval_seconds=0.2)

    @app.job("billing.charge")
    def charge(job: jobbus.SyncJobExecution) -> dict[str, str]:
        return {"charged": job.configuration["card"]}

    with app.sync:
        job_id = app.sync.schedule("billing.charge", {"card": word})
    app.sync.drain()

    without = processes.dashboard()
    page.goto(f"{without}/jobs/{job_id}")
    body = page.locator("main").inner_text()
    assert f"encrypted with key {key_id(parse_key(key, 0))}, not held here" in body
    assert word not in body and "$jobbus.encrypted" not in page.content()
    screenshot(page, "job-encrypted-without-key")

    monkeypatch.setenv("JOBBUS_ENCRYPTION_KEYS", key)
    holding = processes.dashboard()
    page.goto(f"{holding}/jobs/{job_id}")
    body = page.locator("main").inner_text()
    assert word in body and "not held here" not in body
    page.goto(f"{holding}/jobs?status=completed")
    assert word in page.locator("main").inner_text()  # the list's preview too
    screenshot(page, "job-encrypted-with-key")
