"""jobbus behind a real PgBouncer in transaction-pooling mode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus, TransactionPoolerError
from tests.bouncer import pgbouncer, pgbouncer_binary
from tests.processes import finish, prepare, start_worker

pytestmark = [
    pytest.mark.server("PgBouncer reaches the server over TCP; the embedded server listens on a Unix socket only"),
    pytest.mark.skipif(pgbouncer_binary() is None, reason="pgbouncer is not installed (.ci/run installs it)"),
]


@pytest.fixture
def bouncer_dsn(dsn: str) -> Iterator[str]:
    with pgbouncer(dsn) as url:
        yield url


def _app(bouncer_dsn: str, **settings: Any) -> jobbus.App:
    app = jobbus.App(
        dsn=bouncer_dsn,
        **{
            "transaction_pooling": True,
            "poll_interval_seconds": 0.2,
            "retry_base_delay_seconds": 0,
            "retry_max_delay_seconds": 0,
            **settings,
        },
    )

    @app.job("work")
    async def work(job: jobbus.JobExecution) -> int:
        await job.checkpoint({"seen": job.attempt})
        await job.progress(1, 1)
        if job.configuration.get("fail_once") and job.attempt == 1:
            raise RuntimeError("first attempt fails")
        return int(job.configuration["n"]) * 2

    return app


@pytest.mark.parametrize("listen", ["poll-only", "direct-listen"])
async def test_producer_and_worker_through_pgbouncer_transaction_mode(bouncer_dsn: str, dsn: str, listen: str) -> None:
    app = _app(bouncer_dsn, listen_dsn=dsn if listen == "direct-listen" else None)
    async with app:
        ids = await app.schedule_many("work", [{"n": n, "fail_once": n % 5 == 0} for n in range(200)])
        unique = await app.schedule("work", {"n": 1000}, unique_key="k")
        assert await app.schedule("work", {"n": 1001}, unique_key="k") == unique
        assert await app.run_worker(concurrency=8, stop_when_empty=True, install_signal_handlers=False) == 0
        jobs = [await app.find(i) for i in [*ids, unique]]
    assert all(j is not None and j.status is JobStatus.COMPLETED for j in jobs)
    assert [j.result for j in jobs if j] == [n * 2 for n in range(200)] + [2000]
    assert sum(1 for j in jobs if j and j.attempts == 2) == 40


def test_sync_api_and_migrate_through_pgbouncer(bouncer_dsn: str) -> None:
    app = _app(bouncer_dsn)
    with app.sync:
        assert app.sync.migrate() == []
        job_id = app.sync.schedule("work", {"n": 1})
        for _ in range(10):  # enough repetitions that a prepared statement would have been created
            assert app.sync.find(job_id) is not None
        assert app.sync.cancel(job_id) is JobStatus.CANCELLED


def _held_server_connection(bouncer_dsn: str) -> psycopg.Connection[Any]:
    """A client of the pooler inside a transaction: it holds the server connection that was idle last,
    the one the previous client's statements ran on, so that client's next transaction runs on another."""
    conn = psycopg.connect(bouncer_dsn, prepare_threshold=None)
    conn.execute("SELECT 1")
    return conn


def test_a_producer_without_transaction_pooling_behind_the_pooler_raises_one_line_naming_the_setting(
    bouncer_dsn: str,
) -> None:
    app = _app(bouncer_dsn, transaction_pooling=False)
    with app.sync:
        job_id = app.sync.schedule("work", {"n": 1})
        for _ in range(6):  # enough repetitions for psycopg to prepare the statement
            assert app.sync.find(job_id) is not None
        with _held_server_connection(bouncer_dsn), pytest.raises(TransactionPoolerError) as raised:
            for _ in range(20):
                app.sync.find(job_id)
    message = str(raised.value)
    assert "\n" not in message
    assert "transaction-mode pooler" in message and "set transaction_pooling=True" in message
    assert 'prepared statement "_pg3_' in message


def test_a_worker_without_transaction_pooling_behind_the_pooler_exits_78_with_one_line_naming_the_setting(
    bouncer_dsn: str, dsn: str
) -> None:
    prepare(dsn)
    producer = jobbus.App(dsn=dsn)
    with producer.sync:
        producer.sync.schedule_many("record", [{"sleep": 0.05} for _ in range(400)])
    worker = start_worker(bouncer_dsn, "--concurrency", "8")
    try:
        with _held_server_connection(bouncer_dsn):
            code, out = finish(worker, timeout=60)
    finally:
        worker.kill()
    assert code == 78, out[-3000:]
    lines = [line for line in out.splitlines() if "transaction_pooling=True" in line]
    assert len(lines) == 1, out[-3000:]
    assert "transaction-mode pooler" in lines[0] and "exit 78" in lines[0]
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
