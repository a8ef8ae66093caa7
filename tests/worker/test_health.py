"""`/livez` and `/readyz` of real worker processes: a blocked loop, a database gone, a stopping worker."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import schema
from tests.cluster import Cluster, throwaway_cluster
from tests.processes import finish, start_worker, status_of, wait_until

APP = "tests.health_apps:app"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body), or (0, {}) while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (ConnectionError, urllib.error.URLError):
        return 0, {}


def _answers(port: int, path: str, code: int) -> dict[str, Any] | None:
    status, body = _get(port, path)
    return body if status == code else None


@pytest.fixture
def port() -> int:
    return _free_port()


def test_both_endpoints_answer_200_with_the_worker_id_once_it_is_registered(dsn: str, port: int) -> None:
    worker = start_worker(dsn, "--health-port", str(port), "--worker-id", "probed", app=APP)
    try:
        ready = wait_until(lambda: _answers(port, "/readyz", 200), timeout=30, what="/readyz to answer 200")
        live = _answers(port, "/livez", 200)
        assert ready["status"] == "ok" and ready["worker_id"] == "probed" and ready["in_flight"] == 0
        assert live is not None and live["status"] == "ok" and live["worker_id"] == "probed"
        assert _get(port, "/metrics")[0] == 404
    finally:
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out[-3000:]
    assert _get(port, "/livez") == (0, {}), "the port is freed once the worker exits"


def test_a_handler_blocking_the_event_loop_turns_livez_to_503_until_the_loop_runs_again(
    dsn: str, port: int, sync_app: jobbus.App
) -> None:
    worker = start_worker(dsn, "--health-port", str(port), app=APP)
    try:
        wait_until(lambda: _answers(port, "/livez", 200), timeout=30, what="/livez to answer 200")
        job_id = sync_app.sync.schedule("block_loop", {"seconds": 4})
        blocked = wait_until(lambda: _answers(port, "/livez", 503), timeout=30, what="/livez to answer 503")
        assert blocked["status"] == "event loop blocked"
        assert blocked["in_flight"] == 1 and blocked["loop_silent_seconds"] >= 0.5
        assert _get(port, "/readyz")[0] == 503
        wait_until(lambda: status_of(dsn, job_id) == "completed", timeout=30, what="the job to complete")
        wait_until(lambda: _answers(port, "/livez", 200), timeout=10, what="/livez to answer 200 again")
    finally:
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out[-3000:]
    assert "the event loop is blocked" in out


def test_a_stopping_worker_answers_503_while_it_waits_for_its_jobs(dsn: str, port: int, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("nap", {"seconds": 6})
    worker = start_worker(dsn, "--health-port", str(port), "--shutdown-timeout", "30", app=APP)
    try:
        wait_until(lambda: status_of(dsn, job_id) == "running", timeout=30, what="the job to start")
        assert _answers(port, "/livez", 200) is not None
        worker.send_signal(signal.SIGTERM)
        stopping = wait_until(lambda: _answers(port, "/livez", 503), timeout=10, what="/livez to answer 503")
        assert stopping["status"] == "stopping" and stopping["in_flight"] == 1
        assert _answers(port, "/readyz", 503) is not None
    finally:
        code, out = finish(worker)
    assert code == 0, out[-3000:]
    assert status_of(dsn, job_id) == "completed"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with throwaway_cluster() as c:
        with psycopg.connect(c.dsn, autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        yield c


def test_readyz_answers_503_while_the_database_is_down_and_200_once_it_is_back(cluster: Cluster, port: int) -> None:
    worker = start_worker(cluster.dsn, "--health-port", str(port), app=APP)
    try:
        wait_until(lambda: _answers(port, "/readyz", 200), timeout=30, what="/readyz to answer 200")
        cluster.stop()
        down = wait_until(lambda: _answers(port, "/readyz", 503), timeout=30, what="/readyz to answer 503")
        assert down["status"] == "database unreachable"
        assert _answers(port, "/livez", 200) is not None, "the loop still runs: the process needs no restart"
        cluster.start()
        wait_until(lambda: _answers(port, "/readyz", 200), timeout=60, what="/readyz to answer 200 again")
    finally:
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out[-3000:]


def test_a_health_port_in_use_stops_the_worker_at_start_with_one_line_and_exit_69(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = finish(start_worker(dsn, "--health-port", str(port), app=APP))
    assert code == 69, out
    assert f"error: --health-port: cannot listen on 127.0.0.1:{port} (Address already in use)" in out


def test_health_port_0_is_refused_by_the_command_and_the_library(dsn: str) -> None:
    code, out = finish(start_worker(dsn, "--health-port", "0", app=APP))
    assert code == 64, out
    assert "--health-port" in out and "0 is not in the range 1<=x<=65535" in out
    with pytest.raises(ValueError, match="health_port must be a TCP port from 1 to 65535, got 0"):
        jobbus.WorkerOptions(health_port=0)


async def test_an_embedded_worker_serves_the_endpoints_until_it_stops(dsn: str, port: int) -> None:
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.5, worker_dead_after_seconds=2)

    @app.job("noop")
    async def noop(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        worker = jobbus.Worker(app, health_port=port)
        task = worker.start()
        await worker.ready()
        status, body = await asyncio.to_thread(_get, port, "/readyz")
        assert (status, body["status"], body["worker_id"]) == (200, "ok", worker.worker_id)
        worker.request_stop()
        assert await task == 0
    assert await asyncio.to_thread(_get, port, "/livez") == (0, {})
