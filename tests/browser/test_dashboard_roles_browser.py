"""The dashboard's roles in headless Chromium: each role sees the controls it may use and who it is,
and the server refuses what a role may not do, even a form forged in the page with its CSRF token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.browser.conftest import Processes, screenshot
from tests.browser.test_dashboard_browser import seed, visit

TOKENS = {"admin": "browser-admin", "operator": "browser-operator", "viewer": "browser-viewer"}


def log_in(page: Any, url: str, token: str, target: str) -> None:
    visit(page, f"{url}/login?next={target}")
    page.fill("input[name=token]", token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}{target}")


def forged_post(page: Any, action: str) -> tuple[int, str]:
    """POST a form built in the page to `action`, with the CSRF token of the page's logout form."""
    answer: tuple[int, str] = tuple(
        page.evaluate(
            """async (action) => {
                const csrf = document.querySelector('form[action$="/logout"] input[name=csrf]').value;
                const body = new URLSearchParams({csrf, next: "/", concurrency: "1"});
                const response = await fetch(action, {method: "POST", body, redirect: "manual"});
                return [response.status, await response.text()];
            }""",
            action,
        )
    )
    return answer


def paused_queues(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT target FROM jobbus.pause WHERE target_kind = 'queue'")]


@pytest.mark.browser(slice=True)
def test_each_role_sees_its_controls_and_the_server_refuses_the_rest(dsn: str, processes: Processes, page: Any) -> None:
    data = seed(dsn)
    url = processes.dashboard(
        "--token", TOKENS["admin"], "--operator-token", TOKENS["operator"], "--viewer-token", TOKENS["viewer"]
    )
    queued = f"/jobs/{data['failed'][0]}"  # no worker runs: still queued

    log_in(page, url, TOKENS["viewer"], "/queues")
    assert page.locator("header .actor").inner_text() == "viewer-token · viewer"
    assert page.get_by_role("button", name="Pause").count() == 0
    assert page.get_by_role("button", name="Set").count() == 0
    assert page.locator("table.limits input").count() == 0
    screenshot(page, "roles-viewer-queues")
    status, text = forged_post(page, "/queues/mail/pause")
    assert status == 403 and "needs the operator role" in text
    visit(page, f"{url}{queued}")
    assert page.get_by_role("button", name="Cancel").count() == 0
    visit(page, f"{url}/jobs")
    assert page.locator("input[name=ids]").count() == 0 and page.locator("form#bulk").count() == 0
    page.get_by_role("button", name="log out").click()
    page.wait_for_url(f"{url}/login")

    log_in(page, url, TOKENS["operator"], "/queues")
    assert page.locator("header .actor").inner_text() == "operator-token · operator"
    assert page.get_by_role("button", name="Set").count() == 0  # limits are an admin's
    status, text = forged_post(page, "/queues/mail/limits")
    assert status == 403 and "needs the admin role" in text
    page.locator('table.queues tr[data-queue="mail"]').get_by_role("button", name="Pause").click()
    page.wait_for_selector("p.flash")
    assert paused_queues(dsn) == ["mail"]
    screenshot(page, "roles-operator-queues")
    visit(page, f"{url}/periodic")
    assert page.get_by_role("button", name="Run now").count() == 0
    visit(page, f"{url}{queued}")
    assert page.get_by_role("button", name="Cancel").count() == 1
    page.get_by_role("button", name="log out").click()
    page.wait_for_url(f"{url}/login")

    log_in(page, url, TOKENS["admin"], "/periodic")
    assert page.locator("header .actor").inner_text() == "admin-token · admin"
    assert page.get_by_role("button", name="Run now").count() == 1
    visit(page, f"{url}/queues")
    assert page.get_by_role("button", name="Set").count() >= 2
    screenshot(page, "roles-admin-queues")
    assert [e for e in page.errors if "403" not in e] == []


@pytest.mark.browser
def test_a_user_named_by_the_trusted_proxy(dsn: str, processes: Processes, page: Any, tmp_path: Path) -> None:
    seed(dsn)
    role_map = tmp_path / "roles.toml"
    role_map.write_text('[roles]\n"alice@example.com" = "operator"\n')
    url = processes.dashboard(
        "--trusted-user-header", "X-Remote-User", "--trusted-proxy", "127.0.0.1/32", "--role-map", str(role_map)
    )
    page.set_extra_http_headers({"X-Remote-User": "alice@example.com"})
    visit(page, f"{url}/queues")
    assert page.locator("header .actor").inner_text() == "alice@example.com · operator"
    assert page.get_by_role("button", name="Set").count() == 0
    page.locator('table.queues tr[data-queue="reports"]').get_by_role("button", name="Pause").click()
    page.wait_for_selector("p.flash")
    assert paused_queues(dsn) == ["reports"]
    screenshot(page, "roles-proxy-user")
    page.set_extra_http_headers({"X-Remote-User": "mallory"})
    visit(page, f"{url}/queues")
    assert "'mallory' has no role" in page.locator("body").inner_text()
