"""Expiry: a job not started by its `expires` never runs; it ends `cancelled` with an error that says it
expired. Only the first start is concerned: retries, durable sleeps and recovery after a crash run as
without an expiry. The claim cancels the expired rows it takes (a budget of them in bulk) and takes
again for them, under limits too; the leader's rescuer cancels those no claim meets."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobRequest, JobStatus
from jobbus.store import Claim, run_sync
from jobbus.store.jobs import CLAIM_EXPIRY_BUDGET
from tests.processes import eventually
from tests.storehelpers import claim, claim_statement, write


def _expire(conn: psycopg.Connection[Any], *ids: uuid.UUID) -> None:
    conn.execute("UPDATE jobbus.job SET expires_at = now() - interval '1 second' WHERE id = ANY(%s)", (list(ids),))


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


def test_expires_is_stored_from_seconds_timedelta_and_datetime(sync_app: jobbus.App) -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    by_seconds = sync_app.sync.schedule("t", expires=60)
    by_delta = sync_app.sync.schedule("t", expires=timedelta(hours=1))
    by_datetime = sync_app.sync.schedule("t", expires=at)
    never = sync_app.sync.schedule("t")
    (many,) = sync_app.sync.schedule_many([JobRequest("t", expires=at)])
    (shared,) = sync_app.sync.schedule_many("t", [{}], expires=at)
    jobs = {job_id: sync_app.sync.find(job_id) for job_id in (by_seconds, by_delta, by_datetime, never, many, shared)}
    got = {
        job_id: (job.expires_at - job.created_at if job and job.expires_at else None) for job_id, job in jobs.items()
    }
    assert timedelta(seconds=59) < got[by_seconds] <= timedelta(seconds=61)  # type: ignore[operator]
    assert timedelta(minutes=59) < got[by_delta] <= timedelta(minutes=61)  # type: ignore[operator]
    assert got[never] is None
    for job_id in (by_datetime, many, shared):
        job = jobs[job_id]
        assert job is not None and job.expires_at == at


@pytest.mark.parametrize(
    ("expires", "problem"),
    [
        (-1, "expires must be more than 0"),
        (0, "expires must be more than 0"),
        (timedelta(seconds=-5), "expires must be more than 0"),
        (float("nan"), "expires must be more than 0"),
        (datetime(2030, 1, 1), "expires must be an aware datetime"),
        ("soon", "expires must be seconds"),
        (True, "expires must be seconds"),
    ],
)
def test_bad_expires_is_refused_and_writes_nothing(dsn: str, sync_app: jobbus.App, expires: Any, problem: str) -> None:
    with pytest.raises(jobbus.InvalidJobError, match=problem):
        sync_app.sync.schedule("t", expires=expires)
    with pytest.raises(jobbus.InvalidJobError, match=problem):
        sync_app.sync.schedule_many([JobRequest("t"), JobRequest("t", expires=expires)])
    with psycopg.connect(dsn) as conn:
        assert _count(conn) == 0


def test_an_expired_job_is_never_claimed_and_ends_cancelled(dsn: str, sync_app: jobbus.App) -> None:
    expired = sync_app.sync.schedule("t", expires=3600)
    fresh = sync_app.sync.schedule("t", expires=3600)
    plain = sync_app.sync.schedule("t")
    with psycopg.connect(dsn, autocommit=True) as conn:
        _expire(conn, expired)
        jobs = claim(sync_app, conn, 10)
    assert {j.id for j in jobs} == {fresh, plain}
    job = sync_app.sync.find(expired)
    assert job is not None
    assert job.status is JobStatus.CANCELLED and job.attempts == 0 and job.started_at is None
    assert job.last_error is not None and "expired" in job.last_error
    assert job.finished_at is not None


def test_expired_jobs_at_the_head_of_a_queue_do_not_shrink_the_batch(dsn: str, sync_app: jobbus.App) -> None:
    head = sync_app.sync.schedule_many("t", [{} for _ in range(5)], priority=5, expires=3600)
    tail = sync_app.sync.schedule_many("t", [{} for _ in range(5)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        _expire(conn, *head)
        jobs = claim(sync_app, conn, 5)
    assert {j.id for j in jobs} == set(tail)
    assert all(j.status is JobStatus.CANCELLED for j in map(sync_app.sync.find, head) if j is not None)


@pytest.mark.parametrize(
    "limits",
    [
        {"concurrency": 2},
        {"concurrency_per_key": 1},
        {"rate_limit": jobbus.RateLimit(2, per=timedelta(minutes=1))},
        {"rate_limit_per_key": jobbus.RateLimit(1, per=timedelta(minutes=1))},
    ],
    ids=["concurrency", "per-key", "rate", "rate-per-key"],
)
def test_expiry_holds_under_limits_and_expired_jobs_take_no_slot(
    dsn: str, sync_app: jobbus.App, limits: dict[str, Any]
) -> None:
    sync_app.sync.set_queue("a", **limits)
    expired = [
        sync_app.sync.schedule("t", queue="a", concurrency_key=f"k{n}", priority=9, expires=3600) for n in range(2)
    ]
    live = [sync_app.sync.schedule("t", queue="a", concurrency_key=f"k{n}") for n in range(2)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        _expire(conn, *expired)
        jobs = claim(sync_app, conn, 10)
        assert {j.id for j in jobs} == set(live)
        for job in jobs:
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
    statuses = Counter(job.status for job in map(sync_app.sync.find, expired) if job is not None)
    assert statuses == {JobStatus.CANCELLED: 2}


def _sweep(app: jobbus.App, conn: psycopg.Connection[Any]) -> int:
    """The rescuer's pass over expired jobs, to the end."""
    total = 0
    while cancelled := run_sync(conn, app.store.cancel_expired_jobs(1000)):
        total += cancelled
    return total


def test_a_job_retrying_after_its_expiry_runs_its_retry(dsn: str, sync_app: jobbus.App) -> None:
    """Expiry concerns the first start only: a retry that falls after the expiry runs."""
    job_id = sync_app.sync.schedule("t", expires=3600, max_attempts=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(sync_app, conn, 1)
        assert write(sync_app, conn, job, JobStatus.QUEUED, error="boom", delay_seconds=0)
        _expire(conn, job_id)
        assert _sweep(sync_app, conn) == 0
        (retry,) = claim(sync_app, conn, 1)
        assert retry.id == job_id and retry.attempts == 2
        assert write(sync_app, conn, retry, JobStatus.COMPLETED)
    found = sync_app.sync.find(job_id)
    assert found is not None and found.status is JobStatus.COMPLETED and found.attempts == 2


def test_a_job_recovered_from_a_dead_worker_after_its_expiry_runs_again(dsn: str, sync_app: jobbus.App) -> None:
    """A worker killed mid-run: the recovered job is not cancelled as expired, by a claim or the sweep."""
    job_id = sync_app.sync.schedule("t", expires=3600, max_attempts=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        claim(sync_app, conn, 1)
        conn.execute("UPDATE jobbus.job SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (job_id,))
        _expire(conn, job_id)
        (recovered,) = run_sync(conn, sync_app.store.recover_expired_leases())
        assert recovered.status is JobStatus.QUEUED
        assert _sweep(sync_app, conn) == 0
        (again,) = claim(sync_app, conn, 1)
    assert again.id == job_id and again.attempts == 2


def test_a_job_given_back_unstarted_is_still_one_never_started(dsn: str, sync_app: jobbus.App) -> None:
    """A claim whose handler could not start in time gives the job back: expiry still concerns it; a job
    that had started before keeps its start (and so runs)."""
    fresh = sync_app.sync.schedule("t", expires=3600)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(sync_app, conn, 1)
        assert write(sync_app, conn, job, JobStatus.QUEUED, released=True, kind="unstarted")
        (started_at,) = conn.execute("SELECT started_at FROM jobbus.job WHERE id = %s", (fresh,)).fetchone() or (0,)
        assert started_at is None
        _expire(conn, fresh)
        assert claim(sync_app, conn, 1) == []
    found = sync_app.sync.find(fresh)
    assert found is not None and found.status is JobStatus.CANCELLED and "expired" in (found.last_error or "")

    retried = sync_app.sync.schedule("t", expires=3600, max_attempts=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(sync_app, conn, 1)
        assert write(sync_app, conn, job, JobStatus.QUEUED, error="boom", delay_seconds=0)
        (job,) = claim(sync_app, conn, 1)
        assert write(sync_app, conn, job, JobStatus.QUEUED, released=True, kind="unstarted")
        _expire(conn, retried)
        assert _sweep(sync_app, conn) == 0
        (job,) = claim(sync_app, conn, 1)
    assert job.id == retried


async def test_a_workflow_sleeping_past_its_expiry_resumes_and_schedules_its_follow_up(app: jobbus.App) -> None:
    """The review's case: a workflow charged the card, then slept past its expiry: it must not be cancelled
    while parked, and its `then=` follow-up (shipping) must come."""
    from tests.workflows.test_waits import running

    charged: list[int] = []

    @app.job("order.fulfil")
    async def fulfil(job: jobbus.JobExecution) -> str:
        await job.step("charge", lambda: charged.append(1))
        await job.sleep("cool-off", timedelta(seconds=2))
        return "fulfilled"

    @app.job("order.ship")
    async def ship(job: jobbus.JobExecution) -> str:
        return "shipped"

    job_id = await app.schedule("order.fulfil", expires=1, then=JobRequest("order.ship"))
    async with running(app):
        done = await app.wait(job_id, timeout=30)
        assert done.status is JobStatus.COMPLETED and done.result == "fulfilled", done.last_error
        shipped = await eventually(
            lambda: app.list_jobs(type="order.ship", status="completed"), what="the follow-up completed"
        )
    assert charged == [1] and len(shipped) == 1


def test_no_leased_job_says_it_started_after_it_expired(dsn: str, sync_app: jobbus.App) -> None:
    """20,000 expiries 2 µs apart, crossed by claims: a job is leased only if it started (by the clock the
    claim compared with) before its expiry, and cancelled only if it had not."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, expires_at)"
            " SELECT jobbus.uuid_generate_v7(), 't', 1, clock_timestamp() + interval '300 ms' + n * interval '2 us'"
            " FROM generate_series(1, 20000) AS n"
        )
        while (
            claim(sync_app, conn, 500)
            or conn.execute("SELECT 1 FROM jobbus.job WHERE status = 'queued' LIMIT 1").fetchone()
        ):
            pass
        rows = conn.execute(
            "SELECT status, count(*), count(*) FILTER (WHERE started_at >= expires_at),"
            " count(*) FILTER (WHERE started_at IS NOT NULL) FROM jobbus.job GROUP BY status"
        ).fetchall()
    by_status = {status: (count, late, started) for status, count, late, started in rows}
    assert set(by_status) <= {"running", "cancelled"} and sum(c for c, _, _ in by_status.values()) == 20_000
    assert by_status.get("running", (0, 0, 0))[1] == 0  # none leased at or after its expiry
    assert by_status.get("cancelled", (0, 0, 0))[2] == 0  # none cancelled as expired after a start


def test_a_claim_behind_many_expired_jobs_cancels_a_budget_of_them_and_says_so(dsn: str, sync_app: jobbus.App) -> None:
    """Expired jobs ahead of a queue are cancelled in bulk, at most CLAIM_EXPIRY_BUDGET per claim (a claim
    of 10 behind 100,000 of them cancelled all in one quadratic statement), and the claim says that more
    may be left: claims go on until the live jobs behind them are reached."""
    expired = 2 * CLAIM_EXPIRY_BUDGET + 500
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, priority, expires_at)"
            " SELECT jobbus.uuid_generate_v7(), 't', 1, 5, now() - interval '1 second' FROM generate_series(1, %s)",
            (expired,),
        )
        live = set(sync_app.sync.schedule_many("t", [{} for _ in range(5)]))
        claims: list[Claim] = []
        while not claims or claims[-1].expired_ahead:
            claims.append(run_sync(conn, claim_statement(sync_app, conn, 10)))
        cancelled = conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'cancelled'").fetchone()
    assert len(claims) == 3 and [c.expired_ahead for c in claims] == [True, True, False]
    assert {j.id for c in claims for j in c.jobs} == live
    assert cancelled == (expired,)


async def test_a_draining_worker_reaches_the_jobs_behind_many_expired_ones(dsn: str, app: jobbus.App) -> None:
    """`drain` (and `--stop-when-empty`) does not take a claim cut short by expired jobs for an empty queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, priority, expires_at)"
            " SELECT jobbus.uuid_generate_v7(), 't', 1, 5, now() - interval '1 second' FROM generate_series(1, %s)",
            (3 * CLAIM_EXPIRY_BUDGET,),
        )
    ran: list[uuid.UUID] = []

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        ran.append(job.id)

    live = await app.schedule_many("t", [{} for _ in range(5)])
    outcomes = await app.drain()
    assert outcomes["completed"] == 5
    assert sorted(ran) == sorted(live)


def test_the_rescuer_cancels_expired_jobs_no_claim_meets(dsn: str, sync_app: jobbus.App) -> None:
    unserved = sync_app.sync.schedule("nobody.serves", expires=3600)
    later = sync_app.sync.schedule("t", expires=3600, available_at=timedelta(hours=2))
    keep = sync_app.sync.schedule("t", available_at=timedelta(hours=2))
    with psycopg.connect(dsn, autocommit=True) as conn:
        _expire(conn, unserved, later)
        assert run_sync(conn, sync_app.store.cancel_expired_jobs(1)) == 1
        assert run_sync(conn, sync_app.store.cancel_expired_jobs(10)) == 1
        assert run_sync(conn, sync_app.store.cancel_expired_jobs(10)) == 0
    for job_id, status in ((unserved, JobStatus.CANCELLED), (later, JobStatus.CANCELLED), (keep, JobStatus.QUEUED)):
        job = sync_app.sync.find(job_id)
        assert job is not None and job.status is status


def test_a_follow_up_and_a_group_callback_carry_their_expiry(dsn: str, sync_app: jobbus.App) -> None:
    at = datetime(2031, 5, 6, tzinfo=UTC)
    first = sync_app.sync.schedule("t", then=JobRequest("t.next", expires=at))
    _, members = sync_app.sync.schedule_group([JobRequest("t")], then=JobRequest("t.done", expires=120))
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 10)
        assert {j.id for j in jobs} == {first, *members}
        for job in jobs:
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
        rows: dict[str, timedelta] = dict(
            conn.execute(
                "SELECT type, expires_at - created_at FROM jobbus.job WHERE type IN ('t.next', 't.done')"
            ).fetchall()
        )
        (absolute,) = conn.execute("SELECT expires_at FROM jobbus.job WHERE type = 't.next'").fetchone() or (None,)
    assert absolute == at
    assert timedelta(seconds=119) < rows["t.done"] <= timedelta(seconds=121)


def test_an_expired_member_counts_as_done_for_its_groups_callback(dsn: str, sync_app: jobbus.App) -> None:
    group, (stale, fresh) = sync_app.sync.schedule_group(
        [JobRequest("t", expires=3600), JobRequest("t")], then=JobRequest("t.merge")
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        _expire(conn, stale)
        (job,) = claim(sync_app, conn, 10)  # the claim cancels the expired member and takes the other
        assert job.id == fresh
        assert conn.execute("SELECT count(*) FROM jobbus.job WHERE type = 't.merge'").fetchone() == (0,)
        assert write(sync_app, conn, job, JobStatus.COMPLETED)
        callbacks = conn.execute("SELECT status FROM jobbus.job WHERE type = 't.merge'").fetchall()
    assert callbacks == [("queued",)]  # once, when the last member ended
    progress = sync_app.sync.group_progress(group)
    assert (progress.cancelled, progress.completed, progress.completion_percentage) == (1, 1, 100)


def test_jobbus_schedule_expires_and_jobs_show(dsn: str) -> None:
    from tests.cli import jobbus as run_cli
    from tests.cli import jobbus_json

    at = "2031-03-04T05:06:07+00:00"
    by_time = run_cli(dsn, "schedule", "t", "--expires", at)
    by_seconds = run_cli(dsn, "schedule", "t", "--expires", "90")
    assert by_time.returncode == 0 and by_seconds.returncode == 0, by_time.stderr + by_seconds.stderr
    shown = jobbus_json(dsn, "jobs", "show", by_time.stdout.strip())
    assert datetime.fromisoformat(shown["expires_at"]) == datetime.fromisoformat(at)
    seconds = jobbus_json(dsn, "jobs", "show", by_seconds.stdout.strip())
    created, expires = (datetime.fromisoformat(seconds[k]) for k in ("created_at", "expires_at"))
    assert timedelta(seconds=89) < expires - created <= timedelta(seconds=91)
    human = run_cli(dsn, "jobs", "show", by_time.stdout.strip())
    assert human.returncode == 0 and "expires" in human.stdout and "2031-03-0" in human.stdout
    for bad in ("-5", "2031-03-04T05:06:07", "soon"):
        result = run_cli(dsn, "schedule", "t", "--expires", bad)
        assert result.returncode == 64, (bad, result.stderr)
        assert "expires" in result.stderr
    with psycopg.connect(dsn) as conn:
        assert _count(conn) == 2


async def test_the_dashboards_job_page_shows_the_expiry(dsn: str) -> None:
    import httpx

    from jobbus.dashboard import create_app

    app = jobbus.App(dsn=dsn)
    async with app:
        job_id = await app.schedule("t", expires=datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC))
        plain = await app.schedule("t")
    asgi = create_app(jobbus.App(dsn=dsn))
    try:
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            page = (await http.get(f"/jobs/{job_id}")).text
            other = (await http.get(f"/jobs/{plain}")).text
    finally:
        await asgi.state.dashboard.close()
    assert "<dt>expires</dt><dd>2031-03-04 05:06:07Z" in page
    assert "<dt>expires</dt><dd>—</dd>" in other
