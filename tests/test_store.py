"""The job store against a real PostgreSQL: claiming, fencing, recovery, admin operations."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus.models import ClaimedJob, JobStatus
from jobbus.store import run_sync
from tests.storehelpers import claim, expire_lease, write


@pytest.fixture
def conn(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.mark.smoke
def test_eight_concurrent_claimers_take_every_job_exactly_once(sync_app: jobbus.App, dsn: str) -> None:
    sync_app.sync.schedule_many("t", [{"n": i} for i in range(2000)])
    claimed: list[uuid.UUID] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(worker: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while True:
                    jobs = claim(sync_app, c, 25, worker_id=f"w{worker}")
                    if not jobs:
                        return
                    with lock:
                        claimed.extend(j.id for j in jobs)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(claimed) == 2000
    assert len(set(claimed)) == 2000
    with psycopg.connect(dsn) as c:
        statuses: dict[str, int] = dict(c.execute("SELECT status, count(*) FROM jobbus.job GROUP BY status").fetchall())
        attempts = c.execute("SELECT max(attempts), min(attempts) FROM jobbus.job").fetchone()
    assert statuses == {"running": 2000}
    assert attempts == (1, 1)


def test_a_claim_takes_the_free_jobs_at_once_past_one_another_transaction_holds(
    sync_app: jobbus.App, dsn: str, conn: Any
) -> None:
    """A queued job locked by any open transaction (an admin's `SELECT ... FOR UPDATE`, another claim) is
    skipped, not waited for: a worker with free slots takes the other jobs at once."""
    ids = [sync_app.sync.schedule("t", {"n": n}) for n in range(3)]
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM jobbus.job WHERE id = %s FOR UPDATE", (ids[0],))
        conn.execute("SET statement_timeout = '2s'")
        jobs = claim(sync_app, conn, 3)
        assert sorted(j.id for j in jobs) == sorted(ids[1:])
        holder.rollback()
    assert [j.id for j in claim(sync_app, conn, 3)] == [ids[0]]


@pytest.mark.parametrize("split", ["priority", "type"])
def test_a_claim_takes_the_next_group_when_another_transaction_holds_the_first(
    sync_app: jobbus.App, dsn: str, conn: Any, split: str
) -> None:
    """Regression: a claim over several (type, priority) groups shared what it wanted among them by their
    heads, counted without locks; heads held by another transaction (a claim, the leader cancelling
    expired jobs) left it empty-handed while the next group's jobs were free, and a draining worker
    stopped with jobs queued."""
    if split == "priority":
        held = sync_app.sync.schedule_many("t", [{} for _ in range(3)], priority=5)
        free = sync_app.sync.schedule_many("t", [{} for _ in range(3)], priority=0)
        types: tuple[str, ...] = ("t",)
    else:
        held = sync_app.sync.schedule_many("t", [{} for _ in range(3)], available_at=timedelta(seconds=-60))
        free = sync_app.sync.schedule_many("u", [{} for _ in range(3)])
        types = ("t", "u")
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM jobbus.job WHERE id = ANY(%s) FOR UPDATE", (held,))
        conn.execute("SET statement_timeout = '2s'")
        assert sorted(j.id for j in claim(sync_app, conn, 3, types=types)) == sorted(free)
        holder.rollback()
    assert sorted(j.id for j in claim(sync_app, conn, 5, types=types)) == sorted(held)


def test_a_claim_takes_every_free_job_it_can_whatever_other_transactions_hold(
    sync_app: jobbus.App, dsn: str, conn: Any
) -> None:
    """Random groups of types and priorities, a random part of them held by another transaction: a claim
    takes min(limit, free jobs), never a held one, in claim order while nothing is held."""
    rng = random.Random(2026_12_07)
    for _ in range(25):
        conn.execute("DELETE FROM jobbus.job")
        ids: list[uuid.UUID] = []
        for job_type in rng.sample(["t", "u", "v"], rng.randint(1, 3)):
            for priority in rng.sample(range(4), rng.randint(1, 3)):
                ids += sync_app.sync.schedule_many(
                    job_type,
                    [{} for _ in range(rng.randint(1, 6))],
                    priority=priority,
                    available_at=timedelta(seconds=-rng.randint(0, 100)),
                )
        held = set(rng.sample(ids, rng.randint(0, len(ids))))
        limit = rng.randint(1, len(ids) + 2)
        with psycopg.connect(dsn) as holder:
            holder.execute("SELECT 1 FROM jobbus.job WHERE id = ANY(%s) FOR UPDATE", (list(held),))
            jobs = claim(sync_app, conn, limit, types=("t", "u", "v"))
            holder.rollback()
        taken = {j.id for j in jobs}
        assert len(taken) == len(jobs) == min(limit, len(ids) - len(held)) and not taken & held, (limit, len(held))
        if not held:
            order = conn.execute(
                "SELECT id FROM jobbus.job WHERE id = ANY(%s) ORDER BY priority DESC, available_at, id", (ids,)
            ).fetchall()
            assert taken == {row[0] for row in order[:limit]}


def test_claim_order_is_priority_then_available_at_then_id(sync_app: jobbus.App, conn: Any) -> None:
    low = sync_app.sync.schedule("t", priority=0)
    later = sync_app.sync.schedule("t", priority=5, available_at=timedelta(seconds=-10))
    high = sync_app.sync.schedule("t", priority=5, available_at=timedelta(seconds=-20))
    tie_a, tie_b = sync_app.sync.schedule_many("t", [{}, {}], priority=5, available_at=timedelta(seconds=-30))
    future = sync_app.sync.schedule("t", priority=9, available_at=timedelta(hours=1))
    order = [claim(sync_app, conn, 1)[0].id for _ in range(5)]
    assert order == [*sorted([tie_a, tie_b]), high, later, low]
    assert claim(sync_app, conn, 1) == []
    assert sync_app.sync.find(future) is not None


def test_claim_honours_queue_and_type_filters(sync_app: jobbus.App, conn: Any) -> None:
    a = sync_app.sync.schedule("t", queue="a")
    sync_app.sync.schedule("t", queue="b")
    other_type = sync_app.sync.schedule("u", queue="a")
    assert [j.id for j in claim(sync_app, conn, 10, queues=["a"])] == [a]
    assert [j.id for j in claim(sync_app, conn, 10, types=["u"])] == [other_type]


def test_claim_returns_everything_a_handler_needs(sync_app: jobbus.App, conn: Any) -> None:
    group = uuid.uuid4()
    job_id = sync_app.sync.schedule("t", {"k": [1, 2]}, name="N", group_id=group, max_attempts=4, queue="q")
    (job,) = claim(sync_app, conn)
    assert (job.id, job.type, job.queue, job.name, job.group_id) == (job_id, "t", "q", "N", group)
    assert job.configuration_data == {"k": [1, 2]}
    assert (job.attempts, job.max_attempts) == (1, 4)
    assert job.lease_token.version == 7


def test_an_empty_configuration_and_checkpoint_are_claimed_as_dicts_of_their_own(
    sync_app: jobbus.App, conn: Any
) -> None:
    # The claim sends an empty JSON object as NULL (nothing to load); the job still gets `{}`, one per job.
    empty = sync_app.sync.schedule_many("t", [{}, {}])
    filled = sync_app.sync.schedule("t", {"a": {}})
    conn.execute("UPDATE jobbus.job SET execution_data = '{\"offset\": 3}' WHERE id = %s", [filled])
    jobs = {job.id: job for job in claim(sync_app, conn, 3)}
    first, second = (jobs[job_id] for job_id in empty)
    assert (first.configuration_data, first.execution_data, first.oversized_bytes) == ({}, {}, None)
    assert first.configuration_data is not second.configuration_data
    assert first.execution_data is not second.execution_data
    assert (jobs[filled].configuration_data, jobs[filled].execution_data) == ({"a": {}}, {"offset": 3})


def test_each_attempt_gets_a_fresh_uuidv7_lease_token(sync_app: jobbus.App, conn: Any) -> None:
    sync_app.sync.schedule("t")
    (first,) = claim(sync_app, conn)
    expire_lease(conn, first.id)
    run_sync(conn, sync_app.store.recover_expired_leases())
    (second,) = claim(sync_app, conn)
    assert second.id == first.id
    assert second.lease_token != first.lease_token
    assert second.lease_token.version == 7
    assert second.attempts == 2


# -- fencing -----------------------------------------------------------------------------------------


def _reclaimed(app: jobbus.App, conn: Any) -> tuple[ClaimedJob, ClaimedJob]:
    """A job whose first lease expired and which a second worker re-claimed."""
    app.sync.schedule("t", max_attempts=5)
    (old,) = claim(app, conn, worker_id="stale")
    expire_lease(conn, old.id)
    run_sync(conn, app.store.recover_expired_leases())
    (new,) = claim(app, conn, worker_id="fresh")
    return old, new


def _row(conn: Any, job_id: uuid.UUID) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM jobbus.job WHERE id = %s", (job_id,))
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))


@pytest.mark.parametrize(
    "status,kwargs",
    [
        (JobStatus.COMPLETED, {"result_json": '{"stale": true}'}),
        (JobStatus.FAILED, {"error": "stale failure"}),
        (JobStatus.QUEUED, {"error": "stale retry", "delay_seconds": 5}),
        (JobStatus.CANCELLED, {}),
        (JobStatus.QUEUED, {"released": True}),
    ],
)
def test_stale_worker_outcomes_are_rejected_after_reclaim(
    sync_app: jobbus.App, conn: Any, status: JobStatus, kwargs: dict[str, Any]
) -> None:
    old, new = _reclaimed(sync_app, conn)
    before = _row(conn, old.id)
    assert write(sync_app, conn, old, status, **kwargs) is False
    assert _row(conn, old.id) == before
    assert write(sync_app, conn, new, JobStatus.COMPLETED, result_json='{"fresh": true}') is True
    assert _row(conn, old.id)["result"] == {"fresh": True}


@pytest.mark.parametrize("operation", ["checkpoint", "progress", "heartbeat", "heartbeat_many"])
def test_stale_worker_checkpoint_progress_and_heartbeat_are_rejected(
    sync_app: jobbus.App, conn: Any, operation: str
) -> None:
    old, new = _reclaimed(sync_app, conn)
    before = _row(conn, old.id)
    store = sync_app.store
    if operation == "checkpoint":
        result: Any = run_sync(conn, store.checkpoint_job(old.id, old.lease_token, '{"x": 1}'))
        assert result is None
    elif operation == "progress":
        assert run_sync(conn, store.progress_job(old.id, old.lease_token, 1, 2)) is None
    elif operation == "heartbeat":
        assert run_sync(conn, store.heartbeat_job(old.id, old.lease_token, 600)) is None
    else:
        assert run_sync(conn, store.heartbeat_leases({old.id: old.lease_token}, 600)) == {}
    assert _row(conn, old.id) == before
    assert run_sync(conn, store.checkpoint_job(new.id, new.lease_token, '{"x": 2}')) is False
    assert _row(conn, new.id)["execution_data"] == {"x": 2}


def test_expired_lease_cannot_complete_even_before_anyone_reclaims(sync_app: jobbus.App, conn: Any) -> None:
    sync_app.sync.schedule("t")
    (job,) = claim(sync_app, conn)
    expire_lease(conn, job.id)
    assert write(sync_app, conn, job, JobStatus.COMPLETED, result_json="1") is False
    assert _row(conn, job.id)["status"] == "running"


def test_heartbeat_many_renews_live_leases_and_reports_cancellation(sync_app: jobbus.App, conn: Any) -> None:
    sync_app.sync.schedule_many("t", [{}, {}, {}])
    jobs = claim(sync_app, conn, 3, lease_seconds=30)
    sync_app.sync.cancel(jobs[0].id)
    expire_lease(conn, jobs[2].id)
    live = run_sync(conn, sync_app.store.heartbeat_leases({j.id: j.lease_token for j in jobs}, 600))
    assert live.keys() == {jobs[0].id, jobs[1].id}
    requested_ago = live[jobs[0].id]
    assert requested_ago is not None and 0 <= requested_ago < 60 and live[jobs[1].id] is None
    remaining = conn.execute(
        "SELECT lease_expires_at - now() > interval '500 seconds' FROM jobbus.job WHERE id = %s", (jobs[1].id,)
    ).fetchone()
    assert remaining == (True,)


def test_outcomes_of_many_jobs_are_written_in_one_statement(sync_app: jobbus.App, conn: Any) -> None:
    sync_app.sync.schedule_many("t", [{} for _ in range(4)], max_attempts=3)
    a, b, c, d = claim(sync_app, conn, 4)
    from jobbus.store import Outcome

    applied = run_sync(
        conn,
        sync_app.store.record_outcomes(
            [
                Outcome(a.id, a.lease_token, JobStatus.COMPLETED, result_json='{"ok": 1}'),
                Outcome(b.id, b.lease_token, JobStatus.FAILED, error="boom"),
                Outcome(c.id, c.lease_token, JobStatus.QUEUED, error="again", delay_seconds=60),
                Outcome(d.id, d.lease_token, JobStatus.QUEUED, released=True),
            ]
        ),
    )
    assert applied.keys() == {a.id, b.id, c.id, d.id}
    ra, rb, rc, rd = (_row(conn, j.id) for j in (a, b, c, d))
    assert (ra["status"], ra["result"], ra["finished_at"] is not None) == ("completed", {"ok": 1}, True)
    assert (rb["status"], rb["last_error"]) == ("failed", "boom")
    assert (rc["status"], rc["last_error"], rc["attempts"], rc["lease_token"]) == ("queued", "again", 1, None)
    assert rc["available_at"] > rc["created_at"] + timedelta(seconds=50)
    assert (rd["status"], rd["attempts"]) == ("queued", 0)


# -- recovery ----------------------------------------------------------------------------------------


def test_expired_lease_is_requeued_counting_the_attempt_then_failed_when_exhausted(
    sync_app: jobbus.App, conn: Any
) -> None:
    job_id = sync_app.sync.schedule("t", max_attempts=2)
    for attempt in (1, 2):
        (job,) = claim(sync_app, conn)
        assert job.attempts == attempt
        expire_lease(conn, job_id)
        (expired,) = run_sync(conn, sync_app.store.recover_expired_leases())
        assert expired.job_id == job_id
    row = _row(conn, job_id)
    assert row["status"] == "failed"
    assert row["attempts"] == 2
    assert "lease expired" in row["last_error"]
    assert row["finished_at"] is not None


def test_recovery_leaves_live_leases_alone(sync_app: jobbus.App, conn: Any) -> None:
    sync_app.sync.schedule("t")
    claim(sync_app, conn)
    assert run_sync(conn, sync_app.store.recover_expired_leases()) == []


# -- admin -------------------------------------------------------------------------------------------


def test_cancel_queued_running_terminal_and_unknown(sync_app: jobbus.App, conn: Any) -> None:
    queued = sync_app.sync.schedule("t")
    assert sync_app.sync.cancel(queued) is JobStatus.CANCELLED
    assert claim(sync_app, conn) == []
    running = sync_app.sync.schedule("t")
    (job,) = claim(sync_app, conn)
    assert sync_app.sync.cancel(running) is JobStatus.RUNNING
    assert _row(conn, running)["cancellation_requested_at"] is not None
    write(sync_app, conn, job, JobStatus.COMPLETED)  # returned before it read the request: cancelled all the same
    assert sync_app.sync.cancel(running) is JobStatus.CANCELLED
    assert sync_app.sync.cancel(queued) is JobStatus.CANCELLED
    completed = sync_app.sync.schedule("t")
    (job,) = claim(sync_app, conn)
    write(sync_app, conn, job, JobStatus.COMPLETED)
    assert sync_app.sync.cancel(completed) is JobStatus.COMPLETED
    with pytest.raises(jobbus.InvalidStateError, match="does not exist"):
        sync_app.sync.cancel(uuid.uuid4())


def test_manual_retry_only_for_failed_jobs(sync_app: jobbus.App, conn: Any) -> None:
    job_id = sync_app.sync.schedule("t", max_attempts=1)
    with pytest.raises(jobbus.InvalidStateError, match="queued"):
        sync_app.sync.retry(job_id)
    (job,) = claim(sync_app, conn)
    with pytest.raises(jobbus.InvalidStateError, match="running"):
        sync_app.sync.retry(job_id)
    write(sync_app, conn, job, JobStatus.FAILED, error="boom")
    sync_app.sync.retry(job_id)
    row = _row(conn, job_id)
    assert (row["status"], row["attempts"], row["finished_at"]) == ("queued", 0, None)
    (again,) = claim(sync_app, conn)
    assert again.attempts == 1
    write(sync_app, conn, again, JobStatus.COMPLETED)
    with pytest.raises(jobbus.InvalidStateError, match="completed"):
        sync_app.sync.retry(job_id)
    with pytest.raises(jobbus.InvalidStateError, match="does not exist"):
        sync_app.sync.retry(uuid.uuid4())


def test_manual_retry_with_a_delay(sync_app: jobbus.App, conn: Any) -> None:
    job_id = sync_app.sync.schedule("t", max_attempts=1)
    (job,) = claim(sync_app, conn)
    write(sync_app, conn, job, JobStatus.FAILED, error="x")
    sync_app.sync.retry(job_id, available_at=timedelta(hours=1))
    assert claim(sync_app, conn) == []
    assert _row(conn, job_id)["status"] == "queued"


def test_group_progress_counts_statuses(sync_app: jobbus.App, conn: Any) -> None:
    group = uuid.uuid4()
    ids = sync_app.sync.schedule_many("t", [{} for _ in range(4)], group_id=group)
    jobs = claim(sync_app, conn, 2)
    write(sync_app, conn, jobs[0], JobStatus.COMPLETED)
    sync_app.sync.cancel(ids[3])
    progress = sync_app.sync.group_progress(group)
    assert (progress.queued, progress.running, progress.completed, progress.cancelled) == (1, 1, 1, 1)
    assert progress.total == 4
    assert progress.completion_percentage == 50.0
    empty = sync_app.sync.group_progress(uuid.uuid4())
    assert (empty.total, empty.completion_percentage) == (0, 0.0)


def test_list_jobs_filters_and_paginates_in_creation_order(sync_app: jobbus.App) -> None:
    ids = sync_app.sync.schedule_many("t", [{"i": i} for i in range(5)], queue="q")
    sync_app.sync.schedule("other", queue="r")
    page1 = sync_app.sync.list_jobs(queue="q", limit=2)
    page2 = sync_app.sync.list_jobs(queue="q", limit=2, after=page1[-1].id)
    page3 = sync_app.sync.list_jobs(queue="q", limit=2, after=page2[-1].id)
    assert [j.id for j in page1 + page2 + page3] == ids
    assert [j.type for j in sync_app.sync.list_jobs(status="queued", type="other")] == ["other"]
    assert sync_app.sync.list_jobs(status=["completed"]) == []


def test_prune_removes_old_finished_jobs_by_status(sync_app: jobbus.App, conn: Any) -> None:
    done, failed, queued = (sync_app.sync.schedule("t", max_attempts=1) for _ in range(3))
    jobs = {j.id: j for j in claim(sync_app, conn, 2)}
    write(sync_app, conn, jobs[done], JobStatus.COMPLETED)
    write(sync_app, conn, jobs[failed], JobStatus.FAILED, error="x")
    cancelled = sync_app.sync.schedule("t")
    sync_app.sync.cancel(cancelled)
    assert sync_app.sync.prune(timedelta(days=1)) == 0
    assert sync_app.sync.prune(timedelta(0)) == 2
    remaining = Counter(j.status for j in sync_app.sync.list_jobs())
    assert remaining == Counter({JobStatus.FAILED: 1, JobStatus.QUEUED: 1})
    assert sync_app.sync.prune(timedelta(0), statuses=["failed"]) == 1
    assert sync_app.sync.find(queued) is not None
    with pytest.raises(ValueError, match="queued"):
        sync_app.sync.prune(timedelta(0), statuses=["queued"])
