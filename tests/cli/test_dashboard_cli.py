"""`jobbus dashboard` in a real process: the names it answers to (`--allowed-host`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

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


def _role_map(tmp_path: Path, text: str = '[roles]\nalice = "admin"\nbob = "operator"\n') -> str:
    path = tmp_path / "roles.toml"
    path.write_text(text)
    return str(path)


def test_a_trusted_proxys_user_is_known_by_the_connections_own_address(dsn: str, tmp_path: Path) -> None:
    """The proxy's header is believed from 127.0.0.1 (the connection's peer), whatever X-Forwarded-For
    says; a token still works beside it."""
    args = ["--trusted-user-header", "X-Remote-User", "--trusted-proxy", "127.0.0.0/8", "--role-map"]
    proc, url = _serve(dsn, *args, _role_map(tmp_path), "--viewer-token", "v-token")
    try:
        headers = {"x-remote-user": "bob", "x-forwarded-for": "203.0.113.9"}
        page = httpx.get(f"{url}/queues", headers=headers, timeout=30)
        assert page.status_code == 200 and 'bob · <span class="badge role">operator</span>' in page.text
        assert httpx.get(f"{url}/jobs", headers={"x-remote-user": "eve"}, timeout=30).status_code == 403
        assert httpx.get(f"{url}/jobs", timeout=30).status_code == 401
        viewer = httpx.get(f"{url}/queues", headers={"authorization": "Bearer v-token"}, timeout=30)
        assert 'viewer-token · <span class="badge role">viewer</span>' in viewer.text
    finally:
        _stop(proc)


def test_a_forwarded_address_does_not_make_a_request_come_from_the_proxy(dsn: str, tmp_path: Path) -> None:
    args = ["--trusted-user-header", "X-Remote-User", "--trusted-proxy", "10.0.0.0/8", "--role-map"]
    proc, url = _serve(dsn, *args, _role_map(tmp_path))
    try:
        forged = {"x-remote-user": "alice", "x-forwarded-for": "10.0.0.5", "x-real-ip": "10.0.0.5"}
        assert httpx.get(f"{url}/jobs", headers=forged, timeout=30).status_code == 401
        assert httpx.post(f"{url}/queues/default/limits", headers=forged, timeout=30).status_code == 401
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trusted-user-header", "X-User", "--role-map", "ROLES"], "needs --trusted-proxy"),
        (["--trusted-user-header", "X-User", "--trusted-proxy", "10.0.0.0/8"], "needs --role-map"),
        (["--trusted-proxy", "10.0.0.0/8"], "need --trusted-user-header"),
        (
            ["--trusted-user-header", "X-User", "--trusted-proxy", "10.0.0/33", "--role-map", "ROLES"],
            "trusted proxy '10.0.0/33' is not an IP address or network",
        ),
        (
            ["--trusted-user-header", "X-User", "--trusted-proxy", "::1", "--role-map", "MISSING"],
            "No such file or directory",
        ),
        (
            ["--trusted-user-header", "X-User", "--trusted-proxy", "::1", "--role-map", "BAD"],
            "user 'alice': 'superuser' is not a role",
        ),
        (["--token", "same", "--operator-token", "same"], "--token and --operator-token must differ"),
        (["--viewer-token", ""], "--viewer-token must not be empty"),
    ],
)
def test_bad_role_options_are_usage_errors_naming_the_problem(
    dsn: str, tmp_path: Path, args: list[str], message: str
) -> None:
    files = {
        "ROLES": _role_map(tmp_path),
        "MISSING": str(tmp_path / "missing.toml"),
        "BAD": str(tmp_path / "bad.toml"),
    }
    (tmp_path / "bad.toml").write_text('[roles]\nalice = "superuser"\n')
    result = subprocess.run(
        [sys.executable, "-m", "jobbus", "dashboard", "--dsn", dsn, *[files.get(a, a) for a in args]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 64, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    if "BAD" in args:
        assert files["BAD"] in result.stderr  # the file is named
