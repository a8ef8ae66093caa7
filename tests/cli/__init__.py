"""Tests of the `jobbus` command line, run as the real executable in subprocesses.

Helpers here: run a command, start a worker process, poll the database until something holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from tests.processes import wait_until as wait_until

ROOT = Path(__file__).resolve().parent.parent.parent
UNREACHABLE_DSN = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"


def cli_env(dsn: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBBUS_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"
    if dsn is not None:
        env["JOBBUS_DSN"] = dsn
    env.update(extra)
    return env


def jobbus(
    dsn: str | None, *args: str, timeout: float = 60, input: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m jobbus ARGS` to completion with JOBBUS_DSN set to `dsn`."""
    return subprocess.run(
        [sys.executable, "-m", "jobbus", *args],
        cwd=ROOT,
        env=cli_env(dsn, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def jobbus_json(dsn: str | None, *args: str) -> Any:
    result = jobbus(dsn, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def start_worker(dsn: str, worker_id: str, *args: str, app: str = "tests.cli.apps:app") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobbus",
            "worker",
            "--app",
            app,
            "--poll-interval",
            "0.2",
            "--worker-id",
            worker_id,
            *args,
        ],
        cwd=ROOT,
        env=cli_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextmanager
def running_workers(dsn: str, *specs: tuple[str, Sequence[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """Start one worker per (worker_id, extra args), wait until each registered, kill them all at the end."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for worker_id, args in specs:
            procs.append(start_worker(dsn, worker_id, *args))
        for (worker_id, _), proc in zip(specs, procs, strict=True):
            wait_until(partial(_registered, dsn, worker_id, proc), what=f"worker {worker_id} registered")
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def _registered(dsn: str, worker_id: str, proc: subprocess.Popen[str]) -> bool:
    if proc.poll() is not None:
        output = proc.stdout.read() if proc.stdout else ""
        raise AssertionError(f"worker {worker_id} exited {proc.returncode} before registering:\n{output}")
    count = query_value(dsn, "SELECT count(*) FROM jobbus.worker WHERE id = %s AND state <> 'stopped'", worker_id)
    return bool(count == 1)


def wait_exit(proc: subprocess.Popen[str], timeout: float = 30) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the worker prints where its tasks wait
        try:
            output = proc.communicate(timeout=2)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        raise AssertionError(f"process did not exit within {timeout} s:\n{output}") from None


def interrupt(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)


def execute(dsn: str, query: str, *params: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query.encode(), params or None)


def query_value(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query.encode(), params or None).fetchone()
    return row[0] if row else None


def job_status(dsn: str, job_id: str) -> str | None:
    status: str | None = query_value(dsn, "SELECT status FROM jobbus.job WHERE id = %s", job_id)
    return status
