"""The producer API: schedule, schedule_many, deduplication, transactional enqueue, bad input, events."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobRequest, JobStatus


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.smoke
async def test_schedule_stores_every_option(app: jobbus.App) -> None:
    group = uuid.uuid4()
    job_id = await app.schedule(
        "catalog.reindex",
        {"catalog_id": "summer-2026"},
        name="Summer",
        group_id=group,
        unique_key="catalog:summer-2026",
        max_attempts=5,
        available_at=timedelta(minutes=10),
        queue="catalog",
        priority=3,
    )
    assert job_id.version == 7
    job = await app.find(job_id)
    assert job is not None
    assert (job.type, job.queue, job.name, job.group_id, job.unique_key) == (
        "catalog.reindex",
        "catalog",
        "Summer",
        group,
        "catalog:summer-2026",
    )
    assert (job.status, job.priority, job.max_attempts, job.attempts) == (JobStatus.QUEUED, 3, 5, 0)
    assert job.configuration_data == {"catalog_id": "summer-2026"}
    assert job.execution_data == {}
    assert timedelta(minutes=9) < job.available_at - job.created_at <= timedelta(minutes=10, seconds=1)


async def test_handler_defaults_apply_unless_overridden(app: jobbus.App) -> None:
    @app.job("mail.send", queue="mail", max_attempts=7, priority=2)
    async def send(job: jobbus.JobExecution) -> None:
        return None

    default = await app.find(await app.schedule("mail.send"))
    custom = await app.find(await app.schedule("mail.send", queue="urgent", max_attempts=1, priority=9))
    unknown = await app.find(await app.schedule("never.registered"))
    assert default is not None and custom is not None and unknown is not None
    assert (default.queue, default.max_attempts, default.priority) == ("mail", 7, 2)
    assert (custom.queue, custom.max_attempts, custom.priority) == ("urgent", 1, 9)
    assert (unknown.queue, unknown.max_attempts, unknown.priority) == ("default", 3, 0)


async def test_aware_datetime_available_at_is_kept(app: jobbus.App) -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    job = await app.find(await app.schedule("t", available_at=at))
    assert job is not None and job.available_at == at


async def test_schedule_many_returns_ids_in_input_order(app: jobbus.App) -> None:
    ids = await app.schedule_many(
        [
            JobRequest("a", {"i": 0}),
            {"type": "b", "configuration": {"i": 1}, "queue": "q"},
            JobRequest("c", {"i": 2}, priority=4),
            ("d", {"i": 3}),
        ]
    )
    jobs = [await app.find(i) for i in ids]
    assert [(j.type, j.configuration_data["i"]) for j in jobs if j] == [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
    bulk = await app.schedule_many("bulk", [{"n": n} for n in range(3000)], queue="bulk")
    assert len(bulk) == len(set(bulk)) == 3000
    listed = await app.list_jobs(queue="bulk", limit=10_000)
    assert [j.configuration_data["n"] for j in listed] == list(range(3000))
    assert await app.schedule_many("bulk", []) == []


async def test_schedule_many_folds_repeated_unique_keys_onto_one_job(app: jobbus.App) -> None:
    existing = await app.schedule("t", unique_key="k1")
    ids = await app.schedule_many("t", [{"n": 1}, {"n": 2}, {"n": 3}], unique_key="k1")
    assert ids == [existing, existing, existing]
    mixed = await app.schedule_many(
        [JobRequest("t", unique_key="k2"), JobRequest("t", unique_key="k2"), JobRequest("t")]
    )
    assert mixed[0] == mixed[1] != mixed[2]
    assert len(await app.list_jobs()) == 3


@pytest.mark.smoke
async def test_concurrent_schedules_of_one_key_give_one_row_and_one_id(dsn: str) -> None:
    apps = [jobbus.App(dsn=dsn, pool_max_size=2) for _ in range(20)]
    for a in apps:
        await a.open()
    try:
        barrier = asyncio.Event()

        async def schedule(a: jobbus.App, n: int) -> uuid.UUID:
            await barrier.wait()
            return await a.schedule("report", {"n": n}, unique_key="daily")

        tasks = [asyncio.create_task(schedule(a, n)) for n, a in enumerate(apps)]
        await asyncio.sleep(0.05)
        barrier.set()
        ids = await asyncio.gather(*tasks)
    finally:
        for a in apps:
            await a.close()
    assert len(set(ids)) == 1
    assert _count(dsn) == 1


def test_unique_key_is_reusable_after_a_terminal_status(sync_app: jobbus.App) -> None:
    first = sync_app.sync.schedule("t", unique_key="k")
    assert sync_app.sync.schedule("t", unique_key="k") == first
    assert sync_app.sync.schedule("other", unique_key="k") != first  # keys are per type
    sync_app.sync.cancel(first)
    second = sync_app.sync.schedule("t", unique_key="k")
    assert second != first
    job = sync_app.sync.find(second)
    assert job is not None and job.status is JobStatus.QUEUED


async def test_transactional_enqueue_async(app: jobbus.App, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            await app.schedule("t", {"kept": True}, connection=conn)
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await app.schedule_many("t", [{"kept": False}] * 3, connection=conn)
                raise RuntimeError("roll back")
    jobs = await app.list_jobs()
    assert [j.configuration_data for j in jobs] == [{"kept": True}]


def test_transactional_enqueue_sync_is_invisible_until_commit(sync_app: jobbus.App, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        job_id = sync_app.sync.schedule("t", connection=conn)
        assert sync_app.sync.find(job_id) is None  # another connection cannot see it yet
        conn.rollback()
        assert sync_app.sync.find(job_id) is None
        committed = sync_app.sync.schedule("t", connection=conn)
        conn.commit()
    assert sync_app.sync.find(committed) is not None
    assert _count(dsn) == 1


def test_connection_of_the_wrong_kind_is_refused(sync_app: jobbus.App, dsn: str) -> None:
    with psycopg.connect(dsn) as conn, pytest.raises(TypeError, match="sync"):
        asyncio.run(sync_app.schedule("t", connection=conn))  # type: ignore[arg-type]


BAD_INPUTS: list[tuple[dict[str, Any], str]] = [
    ({"configuration": [1, 2]}, "JSON object"),
    ({"configuration": "text"}, "JSON object"),
    ({"configuration": {"when": datetime.now(UTC)}}, "JSON serialisable"),
    ({"configuration": {"x": float("nan")}}, "JSON serialisable"),
    ({"configuration": {1: "int key"}}, "keys must be strings"),
    ({"configuration": {"s": "nul\x00"}}, "NUL"),
    ({"type": ""}, "type must not be empty"),
    ({"type": "x" * 256}, "at most 255"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"available_at": datetime(2030, 1, 1)}, "aware"),
    ({"available_at": "tomorrow"}, "available_at"),
    ({"queue": ""}, "queue"),
    ({"priority": 2**40}, "priority"),
    ({"group_id": "not-a-uuid"}, "group_id"),
    ({"unique_key": ""}, "unique_key"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUTS)
async def test_bad_input_raises_a_clear_error_and_writes_nothing(
    app: jobbus.App, dsn: str, overrides: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"type": "t", "configuration": {}} | overrides
    with pytest.raises(ValueError, match=message):
        await app.schedule(args.pop("type"), args.pop("configuration"), **args)
    with pytest.raises(jobbus.JobbusError, match=message):
        await app.schedule_many([JobRequest("ok"), JobRequest(**({"type": "t"} | overrides))])
    assert _count(dsn) == 0


async def test_unknown_ids(app: jobbus.App) -> None:
    assert await app.find(uuid.uuid4()) is None
    with pytest.raises(jobbus.InvalidStateError):
        await app.cancel(uuid.uuid4())
    with pytest.raises(jobbus.InvalidStateError):
        await app.retry(uuid.uuid4())


async def test_producer_events_fire_after_commit_and_failing_listeners_are_only_logged(
    app: jobbus.App, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[jobbus.JobEvent] = []

    @app.on(jobbus.JobScheduled)
    async def record(event: jobbus.JobScheduled) -> None:
        seen.append(event)

    @app.on(jobbus.JobCancelled)
    def record_cancel(event: jobbus.JobCancelled) -> None:
        seen.append(event)

    @app.on(jobbus.JobScheduled)
    def broken(event: jobbus.JobScheduled) -> None:
        raise RuntimeError("listener bug")

    job_id = await app.schedule("t", unique_key="once")
    assert await app.schedule("t", unique_key="once") == job_id  # deduplicated: no second event
    assert await app.cancel(job_id) is JobStatus.CANCELLED
    assert [type(e).__name__ for e in seen] == ["JobScheduled", "JobCancelled"]
    assert seen[0].job_id == job_id
    assert "listener bug" in caplog.text
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.CANCELLED


def test_sync_twin_offers_the_same_results(sync_app: jobbus.App) -> None:
    group = uuid.uuid4()
    ids = sync_app.sync.schedule_many("t", [{"i": i} for i in range(3)], group_id=group)
    assert sync_app.sync.group_progress(group).queued == 3
    assert sync_app.sync.cancel(ids[0]) is JobStatus.CANCELLED
    job = sync_app.sync.find(ids[1])
    assert job is not None and job.configuration_data == {"i": 1}


def test_app_without_a_dsn_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBBUS_DSN", raising=False)
    with pytest.raises(ValueError, match="JOBBUS_DSN"):
        jobbus.App().sync.schedule("t")


async def test_payloads_over_the_limit_are_refused_naming_the_setting(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, max_payload_bytes=4096)
    async with app:
        with pytest.raises(ValueError, match="max_payload_bytes"):
            await app.schedule("t", {"blob": "x" * 5000})
        assert await app.list_jobs() == []
        assert await app.schedule("t", {"blob": "x" * 1000}) is not None
