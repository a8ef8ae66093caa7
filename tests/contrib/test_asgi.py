"""`jobbus.contrib.asgi.lifespan` with a real FastAPI app (examples/fastapi_app.py) and its test client:
an endpoint enqueues inside its database transaction, the worker in the server's loop runs the job."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from examples import fastapi_app
from fastapi import FastAPI

import jobbus
from jobbus.contrib.asgi import lifespan
from tests.conftest import FAST

ROOT = Path(__file__).resolve().parents[2]

with warnings.catch_warnings():  # this Starlette asks for httpx2 while FastAPI's test client is built on httpx
    warnings.filterwarnings("ignore", message=r".*install `httpx2`")
    from fastapi.testclient import TestClient


@pytest.fixture
def shop(dsn: str) -> Iterator[FastAPI]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(fastapi_app.SCHEMA)
        conn.execute("INSERT INTO stock VALUES ('mug', 1)")
    previous = fastapi_app.app.reconfigure(dsn=dsn, **FAST)
    try:
        yield fastapi_app.api
    finally:
        fastapi_app.app.reconfigure(**previous.as_dict())


def _wait_for(client: TestClient, job_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = client.get(f"/jobs/{job_id}").json()
        if body["status"] == status or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


@pytest.mark.smoke
def test_endpoint_enqueues_in_its_transaction_and_the_lifespan_worker_runs_the_job(shop: FastAPI, dsn: str) -> None:
    with TestClient(shop) as client:
        placed = client.post("/orders", json={"email": "a@example.com", "sku": "mug", "total": "12.50"})
        assert placed.status_code == 200, placed.text
        body = _wait_for(client, placed.json()["job_id"], "completed")
        assert body == {
            "status": "completed",
            "result": {"sent_to": "a@example.com", "order_id": placed.json()["order_id"], "attempt": 1},
        }

        refused = client.post("/orders", json={"email": "b@example.com", "sku": "mug", "total": "3"})
        assert refused.status_code == 409  # out of stock: the order and its job rolled back
    assert _rows(dsn, "SELECT email FROM orders") == [("a@example.com",)]
    assert _rows(dsn, "SELECT type, status FROM jobbus.job") == [("shop.send_receipt", "completed")]
    assert fastapi_app.app._pool is None  # shutdown closed the App


def test_without_the_in_process_worker_a_jobbus_worker_process_runs_the_job(shop: FastAPI, dsn: str) -> None:
    web_only = FastAPI(lifespan=lifespan(fastapi_app.app), routes=shop.routes)  # production: web and workers apart
    with TestClient(web_only) as client:
        placed = client.post("/orders", json={"email": "a@example.com", "sku": "mug", "total": "12.50"})
        assert placed.status_code == 200, placed.text
        assert client.get(f"/jobs/{placed.json()['job_id']}").json()["status"] == "queued"

    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBBUS_")}
    env["JOBBUS_DSN"] = dsn
    worker = subprocess.run(
        [sys.executable, "-m", "jobbus", "worker", "--app", "examples.fastapi_app:app", "--stop-when-empty"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr
    assert _rows(dsn, "SELECT status, result->>'sent_to' FROM jobbus.job") == [("completed", "a@example.com")]


async def test_lifespan_without_a_worker_only_opens_and_closes_the_app(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    state = {"entered": False}

    def inner(_: object) -> Any:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def run() -> Any:
            state["entered"] = True
            yield {"db": "ready"}

        return run()

    async with lifespan(app, then=inner)(object()) as seen:
        assert seen == {"db": "ready"} and state["entered"]
        assert await app.schedule("anything") is not None
    assert app._pool is None


async def test_a_worker_that_cannot_start_fails_the_startup(empty_dsn: str) -> None:
    app = jobbus.App(dsn=empty_dsn)

    @app.task
    def noop() -> None:
        pass

    with pytest.raises(jobbus.SchemaError, match="jobbus migrate"):
        async with lifespan(app, worker=True)(object()):
            pass
    await asyncio.sleep(0)
    assert app._pool is None


def _closed_port_dsn() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/nowhere"


@pytest.mark.parametrize("with_worker", [False, True], ids=["app", "app-and-worker"])
async def test_the_lifespan_with_the_database_down_raises_database_unavailable_within_the_wait(
    with_worker: bool,
) -> None:
    app = jobbus.App(dsn=_closed_port_dsn(), database_wait_seconds=1.5)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    started = time.monotonic()
    with pytest.raises(jobbus.DatabaseUnavailableError, match=r"database_wait_seconds \(1.5 s\).*refused"):
        async with lifespan(app, worker=with_worker)(FastAPI()):
            pytest.fail("the lifespan started without a database")
    assert time.monotonic() - started < 15  # 1.5 s, not psycopg_pool's 30 s
    assert app._pool is None  # nothing left open: a later start tries again from scratch
