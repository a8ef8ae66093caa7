"""The leader's queue sampler counts every finished job once: two leaders sampling at once (one waiting
for the other, then several racing while jobs finish), a job whose transaction commits after a sample
it predates, and a database clock set back. Its statement reads a bounded range of finished jobs."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from jobbus import schema
from jobbus.store import MaintenanceStore, QueueSample, run_sync
from jobbus.worker.services.queue_stats import LATE_SECONDS, TALLY_SECONDS
from tests.plans import NEEDS_AUTO_EXPLAIN, auto_explained
from tests.roles import (
    AUDIT_OF_MIGRATION_36,
    CLAIM_OF_MIGRATION_23,
    WEIGHTS_OF_MIGRATION_28,
    granted_roles,
    without_lines,
)
from tests.storehelpers import behind_a_lock

SAMPLE = MaintenanceStore("jobbus").sample_queues(1.0, late_seconds=LATE_SECONDS, keep_seconds=TALLY_SECONDS)
STATUSES = ("completed", "failed", "cancelled")

Totals = dict[str, tuple[int, int, int]]


def _sample(conn: psycopg.Connection[Any]) -> list[QueueSample]:
    return run_sync(conn, SAMPLE)


def _start_sampling(conn: psycopg.Connection[Any]) -> None:
    """A job waits in another queue, so every sample writes a row: the newest sample is the previous one."""
    conn.execute("INSERT INTO jobbus.job (id, type, queue, max_attempts) VALUES (gen_random_uuid(), 't', 'waiting', 1)")
    _sample(conn)


def _finish(conn: psycopg.Connection[Any], queue: str, status: str, count: int, at: str = "now()") -> None:
    """`count` jobs of `queue` that ended `status` at `at` (an SQL expression; the transaction's start by
    default, as every statement that finishes a job dates it)."""
    conn.execute(
        "INSERT INTO jobbus.job (id, type, queue, max_attempts, status, finished_at) "
        f"SELECT gen_random_uuid(), 't', %s, 1, %s, {at} FROM generate_series(1, %s)".encode(),
        (queue, status, count),
    )


def _counted(conn: psycopg.Connection[Any]) -> Totals:
    """Per queue, the jobs the samples counted as completed, failed and cancelled."""
    rows = conn.execute(
        "SELECT queue, sum(completed)::int, sum(failed)::int, sum(cancelled)::int FROM jobbus.queue_stat "
        "GROUP BY queue HAVING sum(completed + failed + cancelled) > 0"
    ).fetchall()
    return {queue: (completed, failed, cancelled) for queue, completed, failed, cancelled in rows}


def _totals(finished: Counter[tuple[str, str]]) -> Totals:
    queues = {queue for queue, _ in finished}
    return {q: (finished[q, "completed"], finished[q, "failed"], finished[q, "cancelled"]) for q in queues}


def test_a_second_leader_sampling_while_the_first_has_not_committed_counts_only_what_followed(dsn: str) -> None:
    """Two leaders for a moment: the second samples while the first one's sample is not committed yet.
    It waits for it, then counts the jobs finished since, not the first one's again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _start_sampling(conn)  # the jobs below finish after the newest sample
        _finish(conn, "a", "completed", 5)
        _finish(conn, "b", "failed", 3)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        assert {(s.queue, s.completed, s.failed) for s in _sample(first) if s.completed + s.failed} == {
            ("a", 5, 0),
            ("b", 0, 3),
        }

        def finish_meanwhile() -> None:  # while the second waits: after the first one's sample
            with psycopg.connect(dsn, autocommit=True) as conn:
                _finish(conn, "a", "completed", 2)

        second_sample = behind_a_lock(dsn, first, second, SAMPLE, finish_meanwhile)
    assert [(s.queue, s.completed, s.failed) for s in second_sample if s.completed + s.failed] == [("a", 2, 0)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _counted(conn) == {"a": (7, 0, 0), "b": (0, 3, 0)}


def test_leaders_racing_while_jobs_finish_count_every_job_once(dsn: str) -> None:
    """Four leaders sample over and over while jobs finish in transactions that stay open a little: each
    job is counted once, in whichever sample first saw it committed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _start_sampling(conn)
    finished: Counter[tuple[str, str]] = Counter()
    failures: list[BaseException] = []
    writing = threading.Event()
    writing.set()

    def finish_jobs() -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(dsn) as conn:
                for _ in range(60):
                    queue, status, count = rng.choice("abc"), rng.choice(STATUSES), rng.randint(1, 5)
                    _finish(conn, queue, status, count)
                    time.sleep(rng.uniform(0, 0.03))  # dated at the start, committed later
                    conn.commit()
                    finished[queue, status] += count
        except BaseException as exc:
            failures.append(exc)
        finally:
            writing.clear()

    def sample() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while writing.is_set():
                    _sample(conn)
                    time.sleep(0.01)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=finish_jobs), *(threading.Thread(target=sample) for _ in range(4))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60.0)
    assert failures == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        _sample(conn)  # what committed after the racing samples
        assert sum(finished.values()) > 100
        assert _counted(conn) == _totals(finished)
        _sample(conn)
        assert _counted(conn) == _totals(finished)


def test_a_job_committed_after_a_sample_it_predates_is_counted_by_the_next(dsn: str) -> None:
    """A job is dated at the start of the transaction that finishes it: one still open when a sample
    reads is in that sample's time but not in its snapshot. The next sample counts it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _start_sampling(conn)
        with psycopg.connect(dsn) as finishing:
            _finish(finishing, "a", "completed", 2)
            time.sleep(0.05)
            assert [s.queue for s in _sample(conn)] == ["waiting"]  # not committed yet
            finishing.commit()
        assert [(s.queue, s.completed) for s in _sample(conn) if s.completed] == [("a", 2)]
        assert _counted(conn) == {"a": (2, 0, 0)}


def test_a_job_retried_or_deleted_after_it_was_counted_is_not_taken_back(dsn: str) -> None:
    """A failure retried right after it was counted, in seconds the next samples read again, stays counted;
    its second attempt's outcome is counted too. A deleted job stays counted."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _start_sampling(conn)
        _finish(conn, "a", "failed", 1)
        _finish(conn, "a", "completed", 1)
        _sample(conn)
        conn.execute("UPDATE jobbus.job SET status = 'queued', finished_at = NULL WHERE status = 'failed'")
        conn.execute("DELETE FROM jobbus.job WHERE status = 'completed'")
        assert [s.failed + s.completed for s in _sample(conn)] == [0, 0]  # a and waiting: nothing negative
        conn.execute("UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE queue = 'a'")
        _sample(conn)
        assert _counted(conn) == {"a": (2, 1, 0)}


def _set_the_clock_back(conn: psycopg.Connection[Any], seconds: int) -> None:
    """As if the database clock had read `seconds` ahead until now and were set right: everything written
    so far is dated `seconds` ahead of now(), the jobs' finishes, the samples and the sampler's tallies."""
    conn.execute(
        "UPDATE jobbus.job SET finished_at = finished_at + make_interval(secs => %s) WHERE finished_at IS NOT NULL",
        (seconds,),
    )
    for table, column in (("queue_stat", "sampled_at"), ("queue_tally", "bucket")):
        # Through the far future: a key moved onto one not moved yet would break the primary key.
        far = "interval '1000 years'"
        conn.execute(f"UPDATE jobbus.{table} SET {column} = {column} + {far}".encode())
        conn.execute(
            f"UPDATE jobbus.{table} SET {column} = {column} - {far} + make_interval(secs => %s)".encode(), (seconds,)
        )


def test_a_clock_set_back_neither_loses_nor_repeats_a_count(dsn: str) -> None:
    """Two hours of jobs, counted by one sample after a leader's absence of two hours; then the clock
    goes back 90 minutes. The jobs finished since land among those counted before, in seconds already
    sampled: each is counted once, and no job counted before is counted again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled) VALUES (now() - interval '2 hours', 'a', 0, 0, 0, 0, 0, 0)"
        )
        conn.execute(  # one every 5 seconds: a and b by turns, two completed and one failed by turns
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, status, finished_at) "
            "SELECT gen_random_uuid(), 't', (ARRAY['a', 'b'])[1 + n % 2], 1, "
            "(ARRAY['completed', 'failed'])[1 + n % 3 / 2], now() - make_interval(secs => 5 * n + 1) "
            "FROM generate_series(0, 1439) AS n"
        )
        _sample(conn)
        before = _counted(conn)
        assert sum(map(sum, before.values())) == 1440
        _set_the_clock_back(conn, 90 * 60)
        assert conn.execute(
            "SELECT count(*) FROM jobbus.job WHERE finished_at BETWEEN now() - interval '10 seconds' "
            "AND now() + interval '10 seconds'"
        ).fetchone() == (4,)  # counted, around the clock now
        _finish(conn, "a", "completed", 4)
        _finish(conn, "b", "failed", 2)
        _sample(conn)
        _finish(conn, "a", "cancelled", 3)
        # A transaction that finished a job before the clock went back and committed only after.
        _finish(conn, "b", "completed", 1, at="(SELECT max(sampled_at) FROM jobbus.queue_stat) - interval '2 seconds'")
        _sample(conn)
        _sample(conn)
        after = _counted(conn)
    assert after == {"a": (before["a"][0] + 4, before["a"][1], 3), "b": (before["b"][0] + 1, before["b"][1] + 2, 0)}


FINISHED_OVER = (
    "INSERT INTO jobbus.job (id, type, queue, max_attempts, status, finished_at) "
    "SELECT gen_random_uuid(), 't', 'q' || n %% 7, 1, 'completed', now() - make_interval(secs => n * 0.036) "
    "FROM generate_series(1, %s) AS n"
)


def _rows_read(conn: psycopg.Connection[Any]) -> list[int]:
    """The finished jobs a sample reads, per range."""
    _, plans = auto_explained(conn, lambda: _sample(conn))
    assert not re.search(r"Seq Scan on job(?!_)", plans), plans
    # Actual rows per loop: an integer before PostgreSQL 18, with two decimals from 18 on.
    found = re.findall(r"Index Scan using job_finished_idx on job .*? rows=([\d.]+) loops", plans)
    return [round(float(rows)) for rows in found]


@pytest.mark.server(NEEDS_AUTO_EXPLAIN)
def test_a_sample_reads_seconds_of_finished_jobs_even_with_the_clock_set_back(dsn: str) -> None:
    """200,000 jobs finished over the last 2 hours (28 a second, twice that in the last 11 seconds): a
    sample after the first reads, through job_finished_idx, those of the seconds it may have to count,
    less than a minute of them at the busiest rate; with the clock set back 90 minutes too, around the
    clock and before the newest sample."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FINISHED_OVER.encode(), (200_000,))
        conn.execute("ANALYZE jobbus.job")
        _sample(conn)
        conn.execute(FINISHED_OVER.encode(), (300,))
        reads = [_rows_read(conn)]
        _set_the_clock_back(conn, 90 * 60)
        reads.append(_rows_read(conn))
    assert [len(scans) for scans in reads] == [2, 2], reads
    assert all(0 < sum(scans) < 60 * 2 * 28 for scans in reads), reads
    assert reads[1][1] > 0, reads  # set back: the seconds before the newest sample are read too


def test_the_first_sample_after_the_upgrade_counts_nothing_again(dsn: str) -> None:
    """The samples of the release before kept no tallies: the first sample of this one takes what lies
    before the newest sample as counted, and counts late only in the buckets it tallied."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _finish(conn, "a", "completed", 3, at="now() - interval '5 seconds'")
        conn.execute(
            "INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, "
            "cancelled) VALUES (now() - interval '2 seconds', 'a', 0, 0, 0, 3, 0, 0)"
        )
        _sample(conn)
        _finish(conn, "a", "completed", 1, at="now() - interval '1 second'")  # committed late, in a tallied bucket
        _sample(conn)
        assert _counted(conn) == {"a": (4, 0, 0)}


def test_a_worker_role_granted_before_this_release_samples_without_new_grants(empty_dsn: str) -> None:
    """A rolling deploy that does not grant again: the worker role was granted before the queue tallies
    (migration 16) and the schema migrated since, yet its leader samples (the function keeps the tallies
    with the schema owner's rights; migration 19 grants it to the roles that may lead)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split("\n-- 0016_")[0].encode())

    def earlier(script: str) -> str:
        return without_lines(
            script,
            "sample_queues",
            CLAIM_OF_MIGRATION_23,
            *WEIGHTS_OF_MIGRATION_28,
            "schedule_keyed",
            AUDIT_OF_MIGRATION_36,
        )

    with granted_roles(empty_dsn, ("worker", "operator", "observer"), edit=earlier) as roles:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        with psycopg.connect(roles["worker"], autocommit=True) as conn:
            _start_sampling(conn)
            _finish(conn, "a", "failed", 2)
            _sample(conn)
            assert _counted(conn) == {"a": (0, 2, 0)}
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM jobbus.queue_tally")
