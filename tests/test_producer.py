"""The producer API: schedule, schedule_many, deduplication, transactional enqueue, bad input, events."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobbus
import jobbus.store as jobbus_store
import jobbus.store.jobs as jobbus_jobs
from jobbus import JobRequest, JobStatus
from jobbus.durations import EARLIEST_AVAILABLE_AT, LATEST_AVAILABLE_AT
from jobbus.models import SharedSpecs
from jobbus.producer import plan
from jobbus.requests import MAX_JSON_DEPTH, JobDefaults, JobOptions, build_spec, json_text, specs_sharing
from tests.conftest import FAST
from tests.mypy_run import mypy_output
from tests.storehelpers import claim, write


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


def test_a_running_job_of_the_key_deduplicates_until_it_ends(sync_app: jobbus.App, dsn: str) -> None:
    """Queued or running, an active job of a (type, unique_key) answers a new call with its id; once it
    ends, the key schedules a new job."""
    first = sync_app.sync.schedule("t", {"n": 1}, unique_key="k")
    with psycopg.connect(dsn, autocommit=True) as conn:
        (running,) = claim(sync_app, conn, 1)
        assert running.id == first
        assert sync_app.sync.schedule("t", {"n": 2}, unique_key="k") == first
        assert _count(dsn) == 1
        assert write(sync_app, conn, running, JobStatus.COMPLETED)
    second = sync_app.sync.schedule("t", {"n": 3}, unique_key="k")
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


#: 1,000 CJK characters that do not compress: 3,000 bytes, over PostgreSQL's btree entry limit.
RANDOM_CJK = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(2000))


def nested(depth: int) -> dict[str, Any]:
    """A configuration whose containers nest `depth + 1` levels deep."""
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


BAD_INPUTS: list[tuple[dict[str, Any], str]] = [
    ({"configuration": [1, 2]}, "JSON object"),
    ({"configuration": "text"}, "JSON object"),
    ({"configuration": {"when": datetime.now(UTC)}}, "JSON serialisable"),
    ({"configuration": {"x": float("nan")}}, "is nan: JSON has no NaN or Infinity"),
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
    ({"max_attempts": 2**40}, r"max_attempts must be at most 2147483647 \(32 bits\)"),
    ({"unique_key": RANDOM_CJK[:1000]}, "unique_key is 3000 bytes long in UTF-8, at most 1000"),
    ({"type": "é" * 128}, "type is 256 bytes long in UTF-8, at most 255"),
    ({"queue": "队" * 86}, "queue is 258 bytes"),
    ({"name": "名" * 334}, "name is 1002 bytes"),
    ({"queue": "q\ud800"}, "queue contains a lone surrogate"),
    ({"available_at": timedelta(days=10**8)}, "available_at: a delay of 100000000 days.* is out of range"),
    ({"available_at": timedelta(days=-(10**6))}, "out of range"),
    ({"available_at": datetime.fromisoformat("9999-12-31T23:00:00-14:00")}, "23:00:00-14:00 is out of range"),
    ({"available_at": datetime.fromisoformat("0001-01-01T00:00:00+01:00")}, "out of range"),
    ({"configuration": {"prompt": "\ud800"}}, r'configuration at \["prompt"\] contains a lone surrogate'),
    ({"configuration": {"a": [{"\udfff": 1}]}}, r'configuration at \["a"\]\[0\]\["\\udfff"\] \(a key\)'),
    ({"configuration": {"a": {"b": [1, float("inf")]}}}, r'configuration at \["a"\]\["b"\]\[1\] is inf: JSON has no'),
    ({"configuration": {"a": {"s": "x\x00"}}}, r'configuration at \["a"\]\["s"\] contains a NUL'),
    ({"configuration": nested(MAX_JSON_DEPTH)}, "configuration is nested too deeply"),
    ({"configuration": nested(5000)}, "configuration is nested too deeply"),
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


async def test_the_largest_accepted_values_are_stored_and_read_back(app: jobbus.App) -> None:
    """At every limit, the row is written and every read of it works (no btree, timestamp or recursion error)."""
    job_type, queue = "類" * 85, "列" * 85  # 255 bytes each
    unique_key = RANDOM_CJK[:333]  # 999 bytes that do not compress
    ids = [
        await app.schedule(
            job_type,
            nested(MAX_JSON_DEPTH - 1),
            queue=queue,
            unique_key=unique_key,
            name="名" * 333,
            max_attempts=2**31 - 1,
            priority=-(2**31),
            available_at=LATEST_AVAILABLE_AT,
        ),
        await app.schedule("t", available_at=EARLIEST_AVAILABLE_AT, priority=2**31 - 1),
        await app.schedule("t", available_at=LATEST_AVAILABLE_AT - datetime.now(UTC) - timedelta(days=1)),
    ]
    latest = await app.find(ids[0])
    assert latest is not None
    assert (latest.type, latest.queue, latest.unique_key) == (job_type, queue, unique_key)
    assert latest.available_at == LATEST_AVAILABLE_AT and latest.configuration_data == nested(MAX_JSON_DEPTH - 1)
    earliest = await app.find(ids[1])
    assert earliest is not None and earliest.available_at == EARLIEST_AVAILABLE_AT
    assert {job.id for job in await app.list_jobs()} == set(ids)


async def test_retry_refuses_an_available_at_out_of_range_and_leaves_the_job_failed(app: jobbus.App, dsn: str) -> None:
    job_id = await app.schedule("t")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'failed', finished_at = now() WHERE id = %s", (job_id,))
    for available_at in (timedelta(days=10**8), datetime.fromisoformat("9999-12-31T23:00:00-14:00")):
        with pytest.raises(jobbus.InvalidJobError, match="out of range"):
            await app.retry(job_id, available_at=available_at)
        with pytest.raises(jobbus.InvalidJobError, match="out of range"):
            await asyncio.to_thread(app.sync.retry, job_id, available_at)
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    await app.retry(job_id, available_at=timedelta(days=365 * 1000))
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.QUEUED and job.available_at.year > 3000
    app.sync.close()


async def test_schedule_many_refuses_a_lone_surrogate_in_any_job_and_writes_nothing(app: jobbus.App, dsn: str) -> None:
    configurations: list[dict[str, Any]] = [{"i": i, "emoji": "😀"} for i in range(100)]
    configurations[57] = {"i": 57, "text": "ok \ud83d broken"}
    with pytest.raises(jobbus.InvalidJobError, match=r'configuration at \["text"\] contains a lone surrogate'):
        await app.schedule_many("t", configurations)
    assert _count(dsn) == 0
    assert len(await app.schedule_many("t", [{"emoji": "😀", "escaped": "\\ud800 and \\u0000"}])) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"r": float("nan")}, r'return value at \["r"\] is nan: JSON has no NaN or Infinity'),
        (float("-inf"), "return value is -inf: JSON has no NaN or Infinity"),
        ([1, {"when": datetime.now(UTC)}], r'return value at \[1\]\["when"\] is not JSON serialisable'),
        ({"r": "\udc80"}, r'return value at \["r"\] contains a lone surrogate'),
        ("\x00", "return value contains a NUL"),
        (nested(MAX_JSON_DEPTH), "return value is nested too deeply"),
        ([[[[]]]] * 2000, None),
    ],
)
def test_json_text_names_what_and_where(value: Any, message: str | None) -> None:
    if message is None:
        assert json_text("the handler's return value", value) == json.dumps(value, separators=(",", ":"))
        return
    with pytest.raises(jobbus.InvalidJobError, match=f"^the handler's {message}"):
        json_text("the handler's return value", value)


def test_json_text_refuses_a_payload_over_the_limit_naming_what() -> None:
    with pytest.raises(jobbus.InvalidJobError, match="checkpoint data is 5011 bytes of JSON, over the limit of 4096"):
        json_text("checkpoint data", {"blob": "x" * 5000}, 4096)


@given(st.text(alphabet=st.characters(codec=None, categories=["Cs", "Lo", "Ll", "Cc", "So"]), max_size=8))
def test_json_text_refuses_exactly_what_jsonb_cannot_hold(text: str) -> None:
    storable = "\x00" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    for value in ({"k": [text]}, {text: 1}):
        if storable:
            assert json.loads(json_text("configuration", value)) == value
        else:
            with pytest.raises(jobbus.InvalidJobError, match="configuration at"):
                json_text("configuration", value)


async def test_queue_limits_are_stored_merged_and_removed(app: jobbus.App) -> None:
    from datetime import timedelta

    assert await app.get_queue("emails") == jobbus.QueueSettings("emails")
    await app.set_queue("emails", concurrency=20, rate_limit=jobbus.RateLimit(100, per=timedelta(minutes=1)))
    merged = await app.set_queue("emails", concurrency_per_key=1)
    assert (merged.concurrency, merged.concurrency_per_key, merged.rate_limit) == (
        20,
        1,
        jobbus.RateLimit(100, timedelta(minutes=1)),
    )
    assert app.sync.get_queue("emails") == merged
    app.sync.close()
    assert [q.queue for q in await app.list_queues()] == ["emails"]
    await app.set_queue("emails", concurrency=None, concurrency_per_key=None, rate_limit=None)
    assert await app.list_queues() == []
    for bad in ({"concurrency": 0}, {"concurrency": "3"}, {"rate_limit": 5}, {"concurrency_per_key": 10**7}):
        with pytest.raises(jobbus.InvalidJobError):
            await app.set_queue("emails", **bad)
    with pytest.raises(jobbus.InvalidJobError, match="period"):
        jobbus.RateLimit(10, per=timedelta(days=30))
    assert jobbus.RateLimit.parse("100/1m") == jobbus.RateLimit(100, timedelta(minutes=1))
    assert jobbus.RateLimit.parse("50/s") == jobbus.RateLimit(50, timedelta(seconds=1))


async def _rows(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT id, type, queue, name, group_id, priority, configuration_data, max_attempts, timeout_seconds,"
            " concurrency_key, status, available_at <= now() FROM jobbus.job WHERE id = ANY(%s)",
            [ids],
        )
        return {row[0]: row[1:] for row in await cur.fetchall()}


async def test_a_large_batch_is_copied_with_every_option_and_announced(app: jobbus.App, dsn: str) -> None:
    """From COPY_MIN_ROWS unkeyed jobs the batch streams by COPY: the rows are the ones a statement writes,
    ids in input order, one notification per (queue, type) at commit."""
    size = jobbus_jobs.COPY_MIN_ROWS + 1
    group = uuid.uuid4()
    configurations = [{"n": n, "text": "café ☕ \U0001f600", "nested": {"list": [n, None, True]}} for n in range(size)]
    requests = [
        JobRequest(
            f"report.{n % 2}",
            configurations[n],
            name=f"job {n}",
            group_id=group,
            max_attempts=4,
            queue=f"q{n % 3}",
            priority=n % 5,
            timeout=1.5,
            concurrency_key="tenant-1" if n % 2 else None,
        )
        for n in range(size)
    ]
    specs, _ = plan.job_specs(app, requests, None, {})
    assert isinstance(app.store.insert_jobs(specs), jobbus_store.Copy)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {app.store.channel}")
        ids = await app.insert_specs(specs)
        notes = [note async for note in listener.notifies(timeout=1.0)]
    assert len(ids) == size == len(set(ids))
    rows = await _rows(dsn, ids)
    for n, job_id in enumerate(ids):
        kind, queue, name, group_id, priority, configuration, attempts, timeout, key, status, due = rows[job_id]
        assert (kind, queue, name, group_id, priority) == (f"report.{n % 2}", f"q{n % 3}", f"job {n}", group, n % 5)
        assert (configuration, attempts, timeout, status, due) == (configurations[n], 4, 1.5, "queued", True)
        assert key == ("tenant-1" if n % 2 else None)
    assert sorted(json.loads(note.payload) for note in notes) == sorted(
        [f"q{n % 3}", f"report.{n % 2}"] for n in range(6)
    )


async def test_a_copied_batch_keeps_absolute_starts_and_a_delayed_one_counts_from_the_database(
    app: jobbus.App, dsn: str
) -> None:
    size = jobbus_jobs.COPY_MIN_ROWS
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    absolute = await app.schedule_many("later", [{}] * size, available_at=at)
    delayed = await app.schedule_many("later", [{}] * size, available_at=timedelta(hours=1))
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE id = ANY(%s) AND available_at = %s),"
            " count(*) FILTER (WHERE id = ANY(%s) AND available_at BETWEEN now() + interval '59 minutes'"
            " AND now() + interval '61 minutes') FROM jobbus.job",
            [absolute, at, delayed],
        )
        assert await cur.fetchone() == (size, size)


async def test_a_copy_repeated_after_its_commit_was_lost_writes_nothing_twice(app: jobbus.App, dsn: str) -> None:
    """A lost connection after COPY committed makes the App send it again: the rows exist, so the copy
    is undone and the ON CONFLICT statement answers in its place."""
    specs, _ = plan.job_specs(app, "report", [{"n": n} for n in range(jobbus_jobs.COPY_MIN_ROWS)], {})
    operation = app.store.insert_jobs(specs)
    assert isinstance(operation, jobbus_store.Copy)
    await app._run(operation)
    assert await app._run(operation) == {}
    assert await app.insert_specs(specs) == [spec.id for spec in specs]
    assert _count(dsn) == len(specs)


@pytest.mark.parametrize("size", [1, 3], ids=["one job", "a batch"])
async def test_a_keyed_insert_repeated_after_its_lost_answer_gets_its_own_id_whatever_the_job_became(
    app: jobbus.App, dsn: str, size: int
) -> None:
    """The answer of a keyed insert was lost after its commit, and the job ran before the App sent the
    statement again: the repeat answers with the job's own id (it raised "an active job holds it but
    this transaction cannot see it", and a caller who believed it scheduled the work twice)."""
    specs, _ = plan.job_specs(app, [JobRequest("mail", {"n": n}, unique_key=f"k{n}") for n in range(size)], None, {})
    await app.insert_specs(specs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'completed', finished_at = now()")
    assert await app.insert_specs(specs) == [spec.id for spec in specs]
    assert _count(dsn) == size


async def test_a_copied_batch_belongs_to_the_callers_transaction(app: jobbus.App, dsn: str) -> None:
    size = jobbus_jobs.COPY_MIN_ROWS
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await app.schedule_many("report", [{}] * size, connection=conn)
        await conn.rollback()
        assert _count(dsn) == 0
        await conn.execute("SELECT 1")  # a transaction already open: the copy's savepoint is inside it
        ids = await app.schedule_many("report", [{}] * size, connection=conn)
        assert _count(dsn) == 0
        await conn.commit()
    assert _count(dsn) == size == len(ids)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await app.schedule_many("report", [{}] * size, connection=conn)
    assert _count(dsn) == 2 * size


def test_a_copied_batch_sync_twin(sync_app: jobbus.App, dsn: str) -> None:
    size = jobbus_jobs.COPY_MIN_ROWS
    with psycopg.connect(dsn) as conn:
        sync_app.sync.schedule_many("report", [{}] * size, connection=conn)
        conn.rollback()
        assert _count(dsn) == 0
    ids = sync_app.sync.schedule_many("report", [{"n": n} for n in range(size)])
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT configuration_data->>'n' FROM jobbus.job ORDER BY id").fetchall()
    assert len(ids) == size and sorted(int(n) for (n,) in rows) == list(range(size))
    specs, _ = plan.job_specs(sync_app, "report", [{}] * size, {})
    operation = sync_app.store.insert_jobs(specs)
    sync_app.sync._run(operation)
    sync_app.sync._run(operation)
    assert _count(dsn) == 2 * size


#: Text that COPY's text format must escape, and text that looks like its escapes.
AWKWARD = "tab\there, line\nbreak, return\r, back\\slash, \\N, \\t"


@pytest.mark.parametrize("size", [2, jobbus_jobs.COPY_MIN_ROWS])
async def test_jobs_of_one_type_share_every_option_and_keep_input_order(app: jobbus.App, dsn: str, size: int) -> None:
    """`schedule_many(type, configurations, **options)` validates the options once: each job is its id and its
    configuration (`SharedSpecs`), written by one statement or, from COPY_MIN_ROWS, by COPY, with every
    option and any text as given; ids in input order, one `JobScheduled` per job."""
    seen: list[jobbus.JobScheduled] = []
    app.on(jobbus.JobScheduled)(seen.append)
    group = uuid.uuid4()
    configurations = [{"n": n, "text": AWKWARD} for n in range(size)]
    options: JobOptions = {
        "queue": f"q {AWKWARD}",
        "name": f"name {AWKWARD}",
        "group_id": group,
        "priority": -3,
        "max_attempts": 7,
        "timeout": 2.5,
        "concurrency_key": f"key {AWKWARD}",
    }
    specs, _ = plan.job_specs(app, f"report {AWKWARD}", configurations, options)
    assert isinstance(specs, SharedSpecs)
    copied = isinstance(app.store.insert_jobs(specs), jobbus_store.Copy)
    assert copied == (size >= jobbus_jobs.COPY_MIN_ROWS)
    ids = await app.schedule_many(f"report {AWKWARD}", configurations, **options)
    assert len(set(ids)) == size and ids == sorted(ids)  # UUIDv7s, made in input order
    rows = await _rows(dsn, ids)
    for n, job_id in enumerate(ids):
        assert rows[job_id] == (
            f"report {AWKWARD}",
            f"q {AWKWARD}",
            f"name {AWKWARD}",
            group,
            -3,
            configurations[n],
            7,
            2.5,
            f"key {AWKWARD}",
            "queued",
            True,
        )
    assert [(e.job_id, e.type, e.queue) for e in seen] == [(i, f"report {AWKWARD}", f"q {AWKWARD}") for i in ids]


async def test_a_copied_batch_keeps_text_copy_escapes_in_every_job(app: jobbus.App, dsn: str) -> None:
    """Jobs of different options are copied row by row, each text escaped for COPY."""
    size = jobbus_jobs.COPY_MIN_ROWS
    requests = [
        JobRequest(f"t{n % 2} {AWKWARD}", {f"k{AWKWARD}": AWKWARD, "n": n}, name=f"{n}{AWKWARD}", queue=AWKWARD)
        for n in range(size)
    ]
    specs, _ = plan.job_specs(app, requests, None, {})
    assert isinstance(app.store.insert_jobs(specs), jobbus_store.Copy)
    ids = await app.insert_specs(specs)
    rows = await _rows(dsn, ids)
    for n, job_id in enumerate(ids):
        kind, queue, name, *_ = rows[job_id]
        assert (kind, queue, name) == (f"t{n % 2} {AWKWARD}", AWKWARD, f"{n}{AWKWARD}")
        assert rows[job_id][5] == {f"k{AWKWARD}": AWKWARD, "n": n}


async def test_a_copied_batch_keeps_absolute_starts_given_in_any_offset(app: jobbus.App, dsn: str) -> None:
    size = jobbus_jobs.COPY_MIN_ROWS
    odd = timezone(timedelta(hours=5, minutes=30, seconds=15, microseconds=7))
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=odd)
    shared = await app.schedule_many("later", [{}] * size, available_at=at)
    starts = [at + timedelta(seconds=n) if n % 2 else (at + timedelta(seconds=n)).astimezone(UTC) for n in range(size)]
    listed = await app.schedule_many([JobRequest("later", {"n": n}, available_at=starts[n]) for n in range(size)])
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT id, available_at FROM jobbus.job")
        found: dict[uuid.UUID, datetime] = dict(await cur.fetchall())
    assert [found[job_id] for job_id in shared] == [at] * size
    assert [found[job_id] for job_id in listed] == starts


async def test_a_copied_batch_wakes_a_waiting_worker(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, **FAST)

    @app.job("wake")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        worker = jobbus.Worker(app, concurrency=50, poll_interval=30)  # a wake-up can only come from a notification
        task = worker.start()
        await worker.ready()
        await asyncio.sleep(0.3)
        await app.schedule_many("wake", [{}] * jobbus_jobs.COPY_MIN_ROWS)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(200):
                cur = await conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'completed'")
                if await cur.fetchone() == (jobbus_jobs.COPY_MIN_ROWS,):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the worker did not run the copied jobs within 20 s of their notification")
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0


def test_jobs_sharing_their_options_read_as_the_specs_they_stand_for() -> None:
    template = build_spec(JobRequest("t", queue="q", priority=2), JobDefaults(), 3)
    shared = specs_sharing(template, [{"n": 0}, None, {"n": 2}], None)
    assert len(shared) == 3
    assert [spec.configuration for spec in shared] == ['{"n":0}', "{}", '{"n":2}']
    assert [spec.id for spec in shared] == list(shared.ids) == sorted(shared.ids)
    assert all((spec.type, spec.queue, spec.priority, spec.max_attempts) == ("t", "q", 2, 3) for spec in shared)
    assert list(shared[1:]) == list(shared)[1:] and isinstance(shared[1:], SharedSpecs)
    with pytest.raises(ValueError, match="belongs to one job"):
        SharedSpecs(dataclasses.replace(template, unique_key="k"), [], [])
    with pytest.raises(ValueError, match="2 ids for 1 configurations"):
        SharedSpecs(template, shared.ids[:2], ["{}"])


def _closed_port_dsn() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/nowhere"


async def test_opening_an_app_while_the_database_is_down_waits_database_wait_seconds_then_says_so() -> None:
    import time

    app = jobbus.App(dsn=_closed_port_dsn(), database_wait_seconds=1)
    started = time.monotonic()
    with pytest.raises(jobbus.DatabaseUnavailableError, match=r"database_wait_seconds \(1 s\).*refused"):
        await app.open()
    with pytest.raises(jobbus.DatabaseUnavailableError, match=r"database_wait_seconds \(1 s\)"):
        app.sync.schedule("t")
    assert time.monotonic() - started < 20  # twice 1 s, not twice psycopg_pool's 30 s
    assert app._pool is None and app.sync._pool is None


def test_job_options_are_the_fields_of_a_job_request() -> None:
    fields = set(JobRequest.__dataclass_fields__) - {"type", "configuration"}
    assert JobOptions.__optional_keys__ == fields


def test_a_wrong_option_keyword_is_a_type_error_and_writes_nothing(sync_app: jobbus.App, dsn: str) -> None:
    app = sync_app

    @app.task("orders.confirm")
    def confirm(order_id: int) -> None:
        pass

    bad: dict[str, Any] = {"queu": "orders"}  # what mypy does not see
    bad_periodic: dict[str, Any] = {"every": 3600, "evry": 3600}
    with pytest.raises(TypeError, match="unexpected keyword argument 'queu'"):
        app.sync.schedule("orders.confirm", **bad)
    with pytest.raises(TypeError, match=r"task\.options\(\): unexpected keyword argument 'queu'"):
        confirm.options(**bad)
    with pytest.raises(TypeError, match=r"app\.job\(\): unexpected keyword argument 'queu'"):
        app.job("orders.cancel", **bad)
    with pytest.raises(TypeError, match=r"app\.task\(\): unexpected keyword argument 'queu'"):
        app.task("orders.refund", **bad)
    with pytest.raises(TypeError, match="periodic job: unexpected keyword argument 'evry'"):
        app.periodic("hourly", type="orders.confirm", **bad_periodic)
    with pytest.raises(TypeError, match="periodic job: unexpected keyword argument 'evry'"):
        app.sync.add_periodic("hourly", type="orders.confirm", **bad_periodic)
    assert _count(dsn) == 0
    assert app.sync.list_periodic() == []
    assert sorted(app.handlers) == ["orders.confirm"] and app.periodics == {}


def test_mypy_rejects_wrong_options_of_jobs_handlers_and_periodic_jobs() -> None:
    out = mypy_output("wrong_options.py")
    for line, error in [
        (29, 'Unexpected keyword argument "queu" for "schedule" of "AsyncProducer"'),
        (30, 'Argument "priority" to "schedule" of "SyncProducer" has incompatible type "str"'),
        (31, 'Unexpected keyword argument "unique_kye" for "schedule_many" of "AsyncProducer"'),
        (32, 'Unexpected keyword argument "queu" for "options" of "Task"'),
        (33, 'Unexpected keyword argument "evry" for "periodic" of "App"'),
        (34, 'Argument "every" to "add_periodic" of "AsyncProducer" has incompatible type "str"'),
        (35, 'Unexpected keyword argument "retries" for "job" of "App"'),
        (36, 'No overload variant of "task" of "App" matches argument types "str", "str"'),
    ]:
        assert f"wrong_options.py:{line}: error: {error}" in out, out
    assert "Found 8 errors in 1 file" in out, out
