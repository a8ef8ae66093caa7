"""Browser tests: Debian's Chromium driven by Playwright's Python package (no browser is downloaded).

`make browser` runs every test here (JOBBUS_BROWSER_FULL=1); the normal suite runs the tests marked
`@pytest.mark.browser(slice=True)`. Without a Chromium executable (`JOBBUS_CHROMIUM`, else `chromium`
on the PATH) they are skipped. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, prepare

SCREENSHOTS = ROOT / "artifacts" / "screenshots"
WORKER_ENV = {
    "JOBBUS_STATS_INTERVAL_SECONDS": "0.5",
    "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "5",
}
#: Flags Chromium needs on a machine without outside network, as root, headless.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    return os.environ.get("JOBBUS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    full = os.environ.get("JOBBUS_BROWSER_FULL") == "1"
    for item in items:
        marker = item.get_closest_marker("browser")
        if marker is None:
            continue
        if chromium_path() is None:
            item.add_marker(pytest.mark.skip(reason="no Chromium executable (apt-get install chromium)"))
        elif not full and not marker.kwargs.get("slice"):
            item.add_marker(pytest.mark.skip(reason="part of the full browser sweep: make browser"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """The dashboard and worker processes of one test, stopped at its end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.procs: list[subprocess.Popen[str]] = []

    def dashboard(self, *args: str) -> str:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobbus", "dashboard", "--dsn", self.dsn, "--port", str(port), *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    return url
            except urllib.error.HTTPError:  # it answers: 503 on a database it cannot read yet
                return url
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the dashboard did not start: {proc.communicate()[0]}") from None
                time.sleep(0.1)

    def worker(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobbus",
                "worker",
                "--app",
                "tests.observability.apps:app",
                "--poll-interval",
                "0.2",
                *args,
            ],
            cwd=ROOT,
            env={**os.environ, "JOBBUS_DSN": self.dsn, "PYTHONUNBUFFERED": "1", **WORKER_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(dsn: str) -> Iterator[Processes]:
    prepare(dsn)
    running = Processes(dsn)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module, closed at its end."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium executable")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class ConsoleErrors(list[str]):
    pass


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context; console errors and uncaught exceptions are collected in page.errors."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    errors = ConsoleErrors()
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.errors = errors
    tab.set_default_timeout(20_000)
    try:
        yield tab
    finally:
        context.close()


def screenshot(tab: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    return path
