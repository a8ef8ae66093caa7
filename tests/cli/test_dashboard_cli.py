"""`jobbus dashboard` in a real process: the names it answers to (`--allowed-host`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from tests.processes import ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(dsn: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "dashboard", "--dsn", dsn, "--port", str(port), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the dashboard did not start: {proc.communicate()[0]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_dashboard_answers_to_loopback_names_and_each_allowed_host(dsn: str) -> None:
    proc, url = _serve(dsn, "--allowed-host", "jobs.example.com", "--allowed-host", ".internal.example")
    try:
        for host, status in [
            ("127.0.0.1", 200),
            ("localhost:8787", 200),
            ("[::1]:8787", 200),
            ("jobs.example.com", 200),
            ("JOBS.example.com:443", 200),
            ("ops.internal.example", 200),
            ("evil.example:8787", 400),
            ("example.com", 400),
        ]:
            response = httpx.get(f"{url}/jobs", headers={"host": host}, timeout=30)
            assert response.status_code == status, (host, response.text[:200])
    finally:
        _stop(proc)


def test_without_allowed_hosts_a_foreign_name_is_refused(dsn: str) -> None:
    proc, url = _serve(dsn)
    try:
        assert httpx.get(f"{url}/queues", timeout=30).status_code == 200
        refused = httpx.get(f"{url}/queues", headers={"host": "evil.example:8787"}, timeout=30)
        assert refused.status_code == 400 and "allowed-host" in refused.text
    finally:
        _stop(proc)


def test_a_malformed_allowed_host_is_a_usage_error(dsn: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobbus", "dashboard", "--dsn", dsn, "--allowed-host", "jobs.example.com:443"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 64, result.stderr
    assert "--allowed-host" in result.stderr and "without a port" in result.stderr
