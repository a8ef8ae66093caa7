"""The examples under examples/ run as the docs say: each section of examples/README.md is followed as
written, in real processes (its install line is checked, not run), and it lists every example. The
FastAPI and Django apps are also driven by tests/contrib/test_asgi.py, tests/contrib/test_fastapi_dashboard.py
and tests/contrib/test_django.py; the pytest plugin's example by tests/test_testing.py."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent


def test_typed_tasks_example(dsn: str) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBBUS_")}
    env["JOBBUS_DSN"] = dsn
    result = subprocess.run(
        [sys.executable, "-m", "examples.typed_tasks"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "refused: task billing.send_invoice: argument 'to': Expected `str`, got `int`"
    assert lines[1] == "drained: {'completed': 1}"
    status, _, stored = lines[2].partition(": ")
    assert status == "completed"
    assert ast.literal_eval(stored) == {"invoice": "INV-7", "to": ["a@example.com", "books@example.com"], "attempt": 1}
    assert lines[3].startswith("queued: not before ")


# -- examples/README.md, followed as written ----------------------------------------------------------

EXAMPLES_README = ROOT / "examples" / "README.md"
#: The README's database and port, swapped for the test's own: the only changes made to its commands.
README_DSN = "postgresql://localhost/shop"
README_PORT = "8000"


def _blocks(section: str) -> list[list[str]]:
    """The lines of each ```bash block of one section of examples/README.md."""
    text = EXAMPLES_README.read_text()
    assert f"\n## {section}\n" in text, section
    part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip().splitlines() for block in re.findall(r"```bash\n(.*?)```", part, re.DOTALL)]


class _Shell:
    """Runs README lines in bash from the repository root, keeping the effect of `cd` and `export`
    lines for the lines after them, as a terminal would; `python` and `jobbus` are this venv's."""

    def __init__(self, dsn: str, port: int, tmp_path: Path) -> None:
        self.dsn, self.port, self.tmp_path = _as_url(dsn), port, tmp_path
        self.env = {key: value for key, value in os.environ.items() if not key.startswith("JOBBUS_")}
        self.env.pop("DATABASE_URL", None)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["UVICORN_PORT"] = str(port)  # uvicorn's default port, for a command that names none
        self.state: list[str] = []  # the cd and export lines so far
        self.servers: list[subprocess.Popen[str]] = []

    def _literal(self, line: str) -> str:
        return line.replace(README_DSN, self.dsn).replace(README_PORT, str(self.port))

    def run(self, line: str) -> str:
        command = self._literal(line)
        result = subprocess.run(
            ["bash", "-e", "-c", "\n".join([*self.state, command])],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
        if command.startswith(("cd ", "export ")):
            self.state.append(command)
        return result.stdout

    def start(self, line: str) -> subprocess.Popen[str]:
        log = (self.tmp_path / f"server-{len(self.servers)}.log").open("w")
        proc = subprocess.Popen(
            ["bash", "-e", "-c", "\n".join([*self.state, f"exec {self._literal(line)}"])],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # runserver's reloader has a child: stop the whole group
        )
        self.servers.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[str]) -> str:
        return (self.tmp_path / f"server-{self.servers.index(proc)}.log").read_text()

    def wait_listening(self, proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 90
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                    return
            except OSError:
                assert proc.poll() is None, f"exited {proc.returncode}:\n{self.log(proc)}"
                assert time.monotonic() < deadline, f"nothing listens on {self.port}:\n{self.log(proc)}"
                time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.servers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _as_url(dsn: str) -> str:
    """A DSN as a URL, which a shell line takes without quotes as the README's does."""
    if "://" in dsn:
        return dsn
    params = conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    host = str(params.pop("host", ""))
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "")), safe="")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    netloc = f"{auth}{host if not host.startswith('/') else ''}{f':{port}' if port else ''}"
    query = dict(params, host=host) if host.startswith("/") else params
    return f"postgresql://{netloc}/{dbname}" + (f"?{urlencode(query)}" if query else "")


@pytest.fixture
def shell(empty_dsn: str, tmp_path: Path) -> Iterator[_Shell]:
    for tool in ("bash", "curl", "psql"):
        if shutil.which(tool) is None:
            pytest.skip(f"examples/README.md uses {tool}, which is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    running = _Shell(empty_dsn, port, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _until(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return value


def test_the_typed_tasks_readme_runs_as_written(shell: _Shell) -> None:
    (steps,) = _blocks("Typed tasks: `typed_tasks.py`")
    assert steps[0] == "pip install -e ."
    for line in steps[1:-1]:
        shell.run(line)
    out = shell.run(steps[-1]).splitlines()
    assert out[0].startswith("refused: ") and out[1] == "drained: {'completed': 1}"


def test_the_fastapi_readme_installs_seeds_and_serves_as_written(shell: _Shell) -> None:
    setup, requests = _blocks("FastAPI: `fastapi_app.py`")
    assert setup[0] == "pip install -e . fastapi uvicorn"  # the example's own dependencies are named
    for line in setup[1:-1]:
        shell.run(line)
    assert setup[-1] == "uvicorn examples.fastapi_app:api"
    shell.wait_listening(shell.start(setup[-1]))

    order, status = requests
    placed = json.loads(shell.run(order))  # the first order succeeds: the stock was seeded
    assert set(placed) == {"order_id", "job_id"}, placed
    assert "JOB_ID" in status
    done = _until(
        lambda: (
            (body := json.loads(shell.run(status.replace("JOB_ID", placed["job_id"]))))["status"] == "completed"
            and body
        ),
        "the receipt job to complete",
    )
    assert done["result"] == {"sent_to": "a@example.com", "order_id": placed["order_id"], "attempt": 1}
    for _ in range(9):
        assert "job_id" in json.loads(shell.run(order))
    assert json.loads(shell.run(order)) == {"detail": "mug is out of stock"}  # the eleventh, as the README says


def test_the_fastapi_dashboard_readme_serves_the_dashboard_behind_the_api_key_as_written(shell: _Shell) -> None:
    setup, requests = _blocks("FastAPI dashboard: `fastapi_dashboard.py`")
    assert setup[0] == "pip install -e '.[dashboard]' fastapi"
    for line in setup[1:-1]:
        shell.run(line)
    assert setup[-1] == "uvicorn examples.fastapi_dashboard:api"
    shell.wait_listening(shell.start(setup[-1]))

    without_key, with_key = requests
    assert "X-API-Key" not in without_key and "X-API-Key: change-me" in with_key
    assert shell.run(without_key).strip() == "401"  # as the README says
    assert shell.run(with_key).strip() == "200"


@pytest.mark.server  # needs a TCP server (the embedded one listens on a socket only)
def test_the_django_readme_migrates_seeds_serves_and_works_as_written(shell: _Shell) -> None:
    setup, worker, requests = _blocks("Django: `django_shop`")
    assert setup[0] == "pip install -e '.[django]'"
    for line in setup[1:-1]:
        shell.run(line)
    assert setup[-1].startswith("python manage.py runserver")
    shell.wait_listening(shell.start(setup[-1]))
    (worker_line,) = worker
    worker_proc = shell.start(worker_line)

    order, listing = requests
    placed = json.loads(shell.run(order))
    assert set(placed) == {"order_id", "receipt_job"}, placed

    def receipt_sent() -> bool:
        assert worker_proc.poll() is None, shell.log(worker_proc)
        with psycopg.connect(shell.dsn) as conn:
            row = conn.execute("SELECT receipt_sent FROM storefront_order WHERE id = %s", (placed["order_id"],))
            return bool(row.fetchone()[0])  # type: ignore[index]

    _until(receipt_sent, "the receipt task to run")
    listed = shell.run(listing)
    assert placed["receipt_job"] in listed and "django.task" in listed and "completed" in listed


def test_the_examples_readme_lists_every_example() -> None:
    """Each file and directory of examples/ has a section of examples/README.md (`## What: `name``),
    and each section names one that exists."""
    listed = set(re.findall(r"^## .*`([^`]+)`$", EXAMPLES_README.read_text(), re.MULTILINE))
    present = {
        path.name
        for path in (ROOT / "examples").iterdir()
        if path.name not in {"README.md", "__init__.py"} and not path.name.startswith((".", "__"))
    }
    assert not present - listed, f"examples/ not listed in examples/README.md: {sorted(present - listed)}"
    assert not listed - present, f"examples/README.md lists what examples/ lacks: {sorted(listed - present)}"
