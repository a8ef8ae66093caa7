"""Uniqueness windows (`unique_for=`) and debounce (`debounce=`), SPEC 21: what a call answers and writes,
retention inside a window, bad input, racing producers (Python and the SQL API at once), and a debounce
call whose transaction is held open past the job's start."""

from __future__ import annotations

import math
import random
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import jobbus
from jobbus.models import JobStatus
from jobbus.store import MaintenanceStore, run_sync
from tests.processes import eventually, wait_until
from tests.roles import granted_roles
from tests.storehelpers import claim, write


def _rows(conn: psycopg.Connection[Any], job_type: str = "t") -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status, configuration_data, available_at = jobbus.never(), debounce_until IS NOT NULL"
        " FROM jobbus.job WHERE type = %s ORDER BY created_at, id",
        (job_type,),
    ).fetchall()


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


def _make_available(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> None:
    conn.execute("UPDATE jobbus.job SET available_at = now() WHERE id = %s", (job_id,))


# -- windows -----------------------------------------------------------------------------------------


def test_a_window_answers_with_the_job_scheduled_in_it_whatever_its_status(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = producer.schedule("t", {"n": 1}, unique_key="daily", unique_for=timedelta(days=1))
        (job,) = claim(sync_app, conn)
        assert write(sync_app, conn, job, JobStatus.FAILED, error="boom")
        again = producer.schedule("t", {"n": 2}, unique_key="daily", unique_for=86400)
        via_sql = conn.execute("SELECT jobbus.schedule('t', '{}', '{\"unique_key\": \"daily\", \"unique_for\": 60}')")
        assert again == first and via_sql.fetchone() == (first,)
        assert _count(conn) == 1
        # Without a window, a finished job frees its key (SPEC 2), as before.
        plain = producer.schedule("t", {"n": 3}, unique_key="daily")
        assert plain != first and _count(conn) == 2
        # A window counts from scheduling: once it has passed, the key schedules again.
        conn.execute("UPDATE jobbus.job SET created_at = created_at - interval '2 days'")
        conn.execute("UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = %s", (plain,))
        later = producer.schedule("t", {"n": 4}, unique_key="daily", unique_for=86400)
        assert later not in (first, plain) and _count(conn) == 3
        row = conn.execute("SELECT unique_until - created_at FROM jobbus.job WHERE id = %s", (later,)).fetchone()
        assert row == (timedelta(days=1),)


def test_an_active_job_answers_a_window_call_even_if_scheduled_before_the_window(
    dsn: str, sync_app: jobbus.App
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        old = sync_app.sync.schedule("t", unique_key="k")
        conn.execute("UPDATE jobbus.job SET created_at = now() - interval '1 hour'")
        assert sync_app.sync.schedule("t", unique_key="k", unique_for=60) == old
        assert _count(conn) == 1


def test_retention_and_prune_keep_a_finished_job_until_its_window_ends(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        windowed = producer.schedule("t", unique_key="w", unique_for=3600)
        plain = producer.schedule("t", unique_key="p")
        conn.execute(
            "UPDATE jobbus.job SET status = 'completed', finished_at = now() - interval '30 days',"
            " created_at = now() - interval '59 minutes'"
        )
        assert producer.prune(older_than=timedelta(days=1)) == 1
        maintenance = MaintenanceStore("jobbus")
        run_sync(conn, maintenance.delete_finished_jobs("completed", 86400, 1000))
        ids = [row[0] for row in conn.execute("SELECT id FROM jobbus.job").fetchall()]
        assert ids == [windowed] and plain not in ids
        # Still inside the window: the call is answered by the kept job.
        assert producer.schedule("t", unique_key="w", unique_for=3600) == windowed
        conn.execute("UPDATE jobbus.job SET unique_until = now() - interval '1 second'")
        run_sync(conn, maintenance.delete_finished_jobs("completed", 86400, 1000))
        assert _count(conn) == 0


BAD: list[tuple[dict[str, Any], str]] = [
    ({"unique_key": "k", "unique_for": -1}, "unique_for"),
    ({"unique_key": "k", "unique_for": 0}, "unique_for"),
    ({"unique_key": "k", "unique_for": math.nan}, "unique_for"),
    ({"unique_key": "k", "unique_for": math.inf}, "unique_for"),
    ({"unique_key": "k", "unique_for": 10**12}, "unique_for"),
    ({"unique_key": "k", "unique_for": "60"}, "unique_for"),
    ({"unique_key": "k", "unique_for": True}, "unique_for"),
    ({"unique_for": 60}, "unique_for"),
    ({"unique_key": "k", "debounce": -0.5}, "debounce"),
    ({"unique_key": "k", "debounce": math.nan}, "debounce"),
    ({"unique_key": "k", "debounce": timedelta(days=400)}, "debounce"),
    ({"debounce": 5}, "debounce"),
    ({"unique_key": "k", "debounce": 5, "unique_for": 60}, "debounce"),
    ({"unique_key": "k", "debounce": 5, "available_at": timedelta(seconds=5)}, "debounce"),
]


@pytest.mark.parametrize(("options", "field"), BAD)
def test_bad_windows_and_debounces_are_refused_and_nothing_is_written(
    dsn: str, sync_app: jobbus.App, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(jobbus.InvalidJobError, match=field):
        sync_app.sync.schedule("t", {}, **options)
    with pytest.raises(jobbus.InvalidJobError, match=field):
        sync_app.sync.schedule_many([jobbus.JobRequest("t", **options)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _count(conn) == 0


def test_a_group_member_cannot_have_a_window_or_debounce(dsn: str, sync_app: jobbus.App) -> None:
    with pytest.raises(jobbus.InvalidJobError, match="schedule_group"):
        sync_app.sync.schedule_group([jobbus.JobRequest("t", unique_key="k", debounce=1)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _count(conn) == 0


def test_a_window_or_debounce_needs_a_read_committed_transaction(dsn: str, sync_app: jobbus.App) -> None:
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
            sync_app.sync.schedule("t", unique_key="k", unique_for=60, connection=conn)
        conn.rollback()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _count(conn) == 0


# -- debounce ----------------------------------------------------------------------------------------


def test_a_burst_of_debounced_calls_leaves_one_job_with_the_last_configuration(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    ids = [producer.schedule("t", {"n": n}, unique_key="user:7", debounce=30) for n in range(5)]
    ids += producer.schedule_many([jobbus.JobRequest("t", {"n": n}, unique_key="user:7", debounce=30) for n in (5, 6)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids.append(
            conn.execute(
                'SELECT jobbus.schedule(\'t\', \'{"n": 7}\', \'{"unique_key": "user:7", "debounce": 30}\')'
            ).fetchone()[0]  # type: ignore[index]
        )
        assert len(set(ids)) == 1
        row = conn.execute(
            "SELECT configuration_data, available_at - now() FROM jobbus.job WHERE id = %s", (ids[0],)
        ).fetchone()
        assert row is not None and row[0] == {"n": 7} and timedelta(seconds=29) < row[1] <= timedelta(seconds=30)
        assert claim(sync_app, conn) == []  # not before its debounce has passed
        _make_available(conn, ids[0])
        (job,) = claim(sync_app, conn)
        assert job.id == ids[0] and job.configuration_data == {"n": 7}


def test_a_call_during_a_run_waits_for_its_end_and_is_not_lost(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = producer.schedule("t", {"n": 1}, unique_key="k", debounce=0.01)
        _make_available(conn, first)
        (running,) = claim(sync_app, conn)
        second = producer.schedule("t", {"n": 2}, unique_key="k", debounce=0.01)
        third = producer.schedule("t", {"n": 3}, unique_key="k", debounce=0.01)
        assert second == third != first
        # A plain call meets the key's active jobs: it is answered and writes nothing.
        assert producer.schedule("t", {"n": 9}, unique_key="k") in (first, second)
        assert _rows(conn) == [(first, "running", {"n": 1}, False, False), (second, "queued", {"n": 3}, True, True)]
        wait_until(
            lambda: (
                conn.execute("SELECT now() > debounce_until FROM jobbus.job WHERE id = %s", (second,)).fetchone()
                == (True,)
            ),
            what="the parked job's debounce to pass",
        )
        assert claim(sync_app, conn) == []  # parked while the key runs, however late
        assert write(sync_app, conn, running, JobStatus.COMPLETED)
        assert _rows(conn)[1] == (second, "queued", {"n": 3}, False, False)
        (job,) = claim(sync_app, conn)
        assert job.id == second and job.configuration_data == {"n": 3}


def test_a_parked_job_waits_for_the_retries_of_the_run_and_a_deleted_run_releases_it(
    dsn: str, sync_app: jobbus.App
) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = producer.schedule("t", {"n": 1}, unique_key="k", debounce=0.01)
        _make_available(conn, first)
        (running,) = claim(sync_app, conn)
        parked = producer.schedule("t", {"n": 2}, unique_key="k", debounce=0.01)
        assert write(sync_app, conn, running, JobStatus.QUEUED, error="again", delay_seconds=3600, kind="retried")
        assert [row[3] for row in _rows(conn)] == [False, True]  # the retry keeps it parked
        producer.delete(first)
        assert _rows(conn) == [(parked, "queued", {"n": 2}, False, False)]


def test_the_job_never_starts_while_a_debounce_call_that_replaces_it_is_committing(
    dsn: str, sync_app: jobbus.App
) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as watcher:
        job_id = producer.schedule("t", {"n": 1}, unique_key="k", debounce=30)
        _make_available(watcher, job_id)
        with psycopg.connect(dsn) as held:
            assert producer.schedule("t", {"n": 2}, unique_key="k", debounce=0.05, connection=held) == job_id
            row = held.execute("SELECT available_at FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
            assert row is not None
            # Past the start this call gives it, and past the one before: still not claimed.
            late = "SELECT clock_timestamp() > %s + interval '0.5 s'"
            wait_until(lambda: watcher.execute(late, (row[0],)).fetchone() == (True,))
            for _ in range(5):
                assert claim(sync_app, watcher) == []
            held.commit()
        (job,) = wait_until(lambda: claim(sync_app, watcher))
        assert job.id == job_id and job.configuration_data == {"n": 2}


def test_the_configuration_of_a_started_job_stays_immutable(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = producer.schedule("t", {"n": 1}, unique_key="k", debounce=0.01)
        _make_available(conn, job_id)
        claim(sync_app, conn)
        conn.execute("SELECT set_config('jobbus.debounce', %s, false)", (str(job_id),))
        with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):
            conn.execute("UPDATE jobbus.job SET configuration_data = '{\"n\": 2}' WHERE id = %s", (job_id,))
        with pytest.raises(psycopg.errors.CheckViolation, match="job_debounce_parked_check"):
            conn.execute("UPDATE jobbus.job SET debounce_until = now() WHERE id = %s", (job_id,))


# -- racing producers --------------------------------------------------------------------------------


def _race(dsn: str, app: jobbus.App, calls: list[tuple[str, dict[str, Any]]], threads: int) -> list[tuple[Any, ...]]:
    """Run `calls` ((via, options) with via "python" or "sql") from `threads` threads at once, while a
    worker thread claims and completes the key's jobs as they become available. Each call records, in
    its own transaction, (order of commit per key, id returned, its configuration's token)."""
    done: list[tuple[Any, ...]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()
    lock = threading.Lock()
    pending = list(enumerate(calls))

    def producer() -> None:
        try:
            with psycopg.connect(dsn) as conn:
                barrier.wait()
                while True:
                    with lock:
                        if not pending:
                            return
                        index, (via, options) = pending.pop()
                    token = {"call": index}
                    if via == "python":
                        job_id = app.sync.schedule("t", token, connection=conn, **options)
                    else:
                        sql_options = {k: v for k, v in options.items()}
                        row = conn.execute("SELECT jobbus.schedule('t', %s, %s)", (Jsonb(token), Jsonb(sql_options)))
                        job_id = row.fetchone()[0]  # type: ignore[index]
                    # Calls of one key commit in the order they took its lock: a sequence read after it
                    # and before the commit numbers them in commit order.
                    (seq,) = conn.execute("SELECT nextval('race_seq')").fetchone()  # type: ignore[misc]
                    conn.commit()
                    with lock:
                        done.append((seq, job_id, index))
        except BaseException as exc:
            errors.append(exc)

    def worker() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                while not stop.is_set():
                    for job in claim(app, conn):
                        running = conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'running'").fetchone()
                        assert running == (1,), running
                        assert write(app, conn, job, JobStatus.COMPLETED, result_json="null")
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE IF NOT EXISTS race_seq")
    runner = threading.Thread(target=worker)
    runner.start()
    producers = [threading.Thread(target=producer) for _ in range(threads)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(120)
    stop.set()
    runner.join(60)
    assert errors == []
    return sorted(done)


@pytest.mark.parametrize("seed", range(3))
def test_racing_window_calls_from_python_and_sql_schedule_one_job(dsn: str, sync_app: jobbus.App, seed: int) -> None:
    rng = random.Random(seed)
    calls = [(rng.choice(["python", "sql"]), {"unique_key": "k", "unique_for": 3600}) for _ in range(40)]
    done = _race(dsn, sync_app, calls, threads=4)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _count(conn) == 1
    assert len({job_id for _, job_id, _ in done}) == 1 and len(done) == 40


@pytest.mark.parametrize("seed", range(3))
def test_racing_debounced_calls_keep_one_queued_beside_one_running_and_the_last_configuration_wins(
    dsn: str, sync_app: jobbus.App, seed: int
) -> None:
    rng = random.Random(seed)
    calls = [(rng.choice(["python", "sql"]), {"unique_key": "k", "debounce": 0.01}) for _ in range(60)]
    done = _race(dsn, sync_app, calls, threads=4)
    assert len(done) == 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, status, configuration_data FROM jobbus.job ORDER BY created_at, id").fetchall()
        # At most one job is left unfinished; each job's configuration is that of the last call it answered.
        assert sum(1 for row in rows if row[1] != "completed") <= 1
        last_call: dict[uuid.UUID, int] = {}
        for _, job_id, index in done:
            last_call[job_id] = index
        for job_id, _, configuration in rows:
            assert configuration == {"call": last_call[job_id]}, (job_id, configuration)
        # The last call to commit is never lost: its job has its configuration and is not yet run or ran after it.
        _, last_id, last_index = done[-1]
        assert {row[0]: row[2] for row in rows}[last_id] == {"call": last_index}


def test_a_producer_role_debounces_and_an_observer_may_not_call_schedule_keyed(dsn: str) -> None:
    """schedule_keyed runs as the schema's owner (a debounced call updates a queued job, which a producer
    may not do itself): executable by the roles that insert jobs only."""
    with granted_roles(dsn, ("worker", "operator", "observer", "producer", "dashboard")) as roles:
        app = jobbus.App(dsn=roles["producer"])
        with app.sync:
            first = app.sync.schedule("t", {"n": 1}, unique_key="k", debounce=30)
            assert app.sync.schedule("t", {"n": 2}, unique_key="k", debounce=30) == first
            assert app.sync.schedule("t", {"n": 3}, unique_key="w", unique_for=30) != first
        with psycopg.connect(roles["observer"]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT jobbus.schedule_keyed('{\"type\": \"t\"}', 'c')")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT configuration_data FROM jobbus.job WHERE id = %s", (first,)).fetchone()
        assert row == ({"n": 2},)


def test_follow_ups_with_debounce_and_a_window_go_through_the_same_rules(dsn: str, sync_app: jobbus.App) -> None:
    """A follow-up (`then=`) is scheduled by the database when its job completes: with debounce, the
    follow-ups of two jobs fold into one job with the configuration of the later; with a window, the
    second is answered by the first."""
    producer = sync_app.sync
    for n in (1, 2):
        producer.schedule(
            "t",
            {"parent": n},
            then=jobbus.JobRequest("u", {"from": n}, unique_key="after", debounce=60),
        )
        producer.schedule("t", {"parent": n}, then=jobbus.JobRequest("v", {"from": n}, unique_key="w", unique_for=60))
    with psycopg.connect(dsn, autocommit=True) as conn:
        claimed = sorted(claim(sync_app, conn, limit=10), key=lambda job: (job.configuration_data or {})["parent"])
        for job in claimed:  # parent 1's follow-ups first, each completion its own transaction
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
        debounced = conn.execute(
            "SELECT configuration_data, available_at - now() > interval '50 seconds' FROM jobbus.job WHERE type = 'u'"
        ).fetchall()
        assert debounced == [({"from": 2}, True)]
        windowed = conn.execute("SELECT unique_until IS NOT NULL FROM jobbus.job WHERE type = 'v'").fetchall()
        assert windowed == [(True,)]


def test_task_options_take_debounce_and_a_window(dsn: str, sync_app: jobbus.App) -> None:
    @sync_app.task("user.reindex")
    def reindex(user_id: int, name: str) -> None:
        pass

    first = reindex.options(unique_key="user:7", debounce=30).defer_sync(7, "Ada")
    assert reindex.options(unique_key="user:7", debounce=30).defer_sync(7, "Ada L.") == first
    daily = reindex.options(unique_key="daily", unique_for=timedelta(days=1)).defer_sync(0, "all")
    assert reindex.options(unique_key="daily", unique_for=timedelta(days=1)).defer_sync(0, "again") == daily
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT configuration_data FROM jobbus.job ORDER BY created_at").fetchall()
    assert len(rows) == 2 and "Ada L." in str(rows[0][0]) and "all" in str(rows[1][0])


def test_a_parked_job_can_be_cancelled_expire_or_be_deleted(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = producer.schedule("t", {"n": 1}, unique_key="k", debounce=0.01)
        _make_available(conn, first)
        (running,) = claim(sync_app, conn)
        parked = producer.schedule("t", {"n": 2}, unique_key="k", debounce=0.01)
        assert producer.cancel(parked) is JobStatus.CANCELLED
        again = producer.schedule("t", {"n": 3}, unique_key="k", debounce=0.01, expires=0.5)
        assert again not in (first, parked)
        wait_until(
            lambda: (
                conn.execute("SELECT now() > expires_at FROM jobbus.job WHERE id = %s", (again,)).fetchone() == (True,)
            )
        )
        assert run_sync(conn, sync_app.store.cancel_expired_jobs()) == 1  # the rescuer's sweep
        last = producer.schedule("t", {"n": 4}, unique_key="k", debounce=0.01)
        producer.delete(last)
        assert write(sync_app, conn, running, JobStatus.COMPLETED)
        rows = conn.execute("SELECT id, status FROM jobbus.job ORDER BY created_at").fetchall()
        assert rows == [(first, "completed"), (parked, "cancelled"), (again, "cancelled")]


async def test_spawn_refuses_a_window_or_debounce_as_it_refuses_a_unique_key(app: jobbus.App, dsn: str) -> None:
    """A child is always scheduled: spawn refuses the unique_key both options need (and each without it),
    and writes no child."""
    refusals: list[str] = []

    @app.job("parent", max_attempts=1)
    async def parent(job: jobbus.JobExecution) -> None:
        for options in ({"debounce": 5}, {"unique_key": "k", "debounce": 5}, {"unique_key": "k", "unique_for": 5}):
            try:
                await job.spawn("child", {}, **options)
            except (jobbus.InvalidJobError, ValueError) as exc:
                refusals.append(str(exc))

    await app.schedule("parent")
    worker = jobbus.Worker(app, concurrency=1)
    task = worker.start()
    await eventually(lambda: len(refusals) == 3, timeout=60, what="the parent's run")
    worker.request_stop()
    await task
    assert "debounce needs a unique_key" in refusals[0]
    assert all("cannot have a unique_key" in text for text in refusals[1:])
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.job WHERE type = 'child'").fetchone() == (0,)


def test_a_weighted_job_keeps_its_weight_through_a_window_or_debounce_and_a_heavy_one_is_refused(
    dsn: str, sync_app: jobbus.App
) -> None:
    """Weights (0028) and the keyed path (0030) meet: schedule_keyed writes the weight and refuses a job
    heavier than a limit of its queue, from Python and from the SQL API, writing nothing."""
    producer = sync_app.sync
    producer.set_queue("tight", concurrency=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        windowed = producer.schedule("t", unique_key="w", unique_for=60, queue="tight", weight=3)
        debounced = producer.schedule("t", unique_key="d", debounce=5, queue="tight", weight=2)
        via_sql = conn.execute(
            'SELECT jobbus.schedule(\'t\', \'{}\', \'{"unique_key": "s", "debounce": 5, "weight": 2}\')'
        ).fetchone()
        assert via_sql is not None
        weights: dict[uuid.UUID, int] = dict(conn.execute("SELECT id, weight FROM jobbus.job").fetchall())
        assert weights == {windowed: 3, debounced: 2, via_sql[0]: 2}
        with pytest.raises(jobbus.InvalidJobError, match="weight"):
            producer.schedule("t", unique_key="x", unique_for=60, queue="tight", weight=4)
        with pytest.raises(jobbus.InvalidJobError, match="weight"):
            producer.schedule("t", unique_key="y", debounce=5, queue="tight", weight=4)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="weight"):
            conn.execute(
                'SELECT jobbus.schedule(\'t\', \'{}\', \'{"unique_key": "z", "unique_for": 5, "queue": "tight",'
                ' "weight": 4}\')'
            )
        assert _count(conn) == 3


def test_run_now_of_a_parked_job_starts_it_as_soon_as_the_run_of_its_key_ends(dsn: str, sync_app: jobbus.App) -> None:
    producer = sync_app.sync
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = producer.schedule("t", {"n": 1}, unique_key="k", debounce=0.01)
        _make_available(conn, first)
        (running,) = claim(sync_app, conn)
        parked = producer.schedule("t", {"n": 2}, unique_key="k", debounce=3600)
        producer.run_now(parked)
        assert claim(sync_app, conn) == []  # never beside the run of its key
        assert write(sync_app, conn, running, JobStatus.COMPLETED)
        (job,) = claim(sync_app, conn)
        assert job.id == parked
