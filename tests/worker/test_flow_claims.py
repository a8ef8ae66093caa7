"""Flow control at the claim, driven as a worker drives it: limits are exact whatever set of queues a
worker serves (one claim counts the jobs it takes itself), a key at its limit never keeps another key
waiting, and a keyed claim reads only the keys it can take from, not every key of the queue."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jobbus
from jobbus.models import ClaimedJob, JobStatus
from jobbus.store import run_sync
from tests.storehelpers import claim, claim_statement, write


def _jobs(app: jobbus.App, queue: str, count: int, *, key: str | None = None, type: str = "t") -> None:
    app.sync.schedule_many([jobbus.JobRequest(type, {}, queue=queue, concurrency_key=key) for _ in range(count)])


def test_a_concurrency_limit_holds_when_the_worker_serves_another_queue(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency=2)
    _jobs(sync_app, "a", 10)
    sync_app.sync.schedule("t", {}, queue="b", available_at=timedelta(hours=1))  # a second queue, nothing due
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 10)
        assert Counter(j.queue for j in jobs) == {"a": 2}
        assert claim(sync_app, conn, 10) == []


def test_a_per_key_limit_holds_when_the_worker_serves_another_queue(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency_per_key=1)
    _jobs(sync_app, "a", 5, key="k")
    _jobs(sync_app, "b", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 10)
        assert Counter(j.queue for j in jobs) == {"a": 1, "b": 1}
        assert claim(sync_app, conn, 10) == []


def test_a_per_key_limit_counts_the_jobs_of_the_key_this_claim_took_in_its_first_pass(
    dsn: str, sync_app: jobbus.App
) -> None:
    """A claim of 6 over two queues takes a share of 3 from each, then the rest: a key limited to 4 gave
    3 in the first pass, below its limit, so the second pass visits it again and may take one more, not
    three (the jobs taken are not running yet: the claim counts them itself)."""
    sync_app.sync.set_queue("a", concurrency_per_key=4)
    _jobs(sync_app, "a", 8, key="k")
    _jobs(sync_app, "b", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 6)
        assert Counter(j.queue for j in jobs) == {"a": 4, "b": 1}
        assert claim(sync_app, conn, 6) == []
        assert write(sync_app, conn, next(j for j in jobs if j.queue == "a"), JobStatus.COMPLETED)
        assert [j.queue for j in claim(sync_app, conn, 6)] == ["a"]


def test_a_rate_limit_holds_when_the_worker_serves_another_queue(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", rate_limit=jobbus.RateLimit(3, per=timedelta(minutes=1)))
    sync_app.sync.set_queue("a2", rate_limit_per_key=jobbus.RateLimit(2, per=timedelta(minutes=1)))
    _jobs(sync_app, "a", 10)
    _jobs(sync_app, "a2", 10, key="k")
    _jobs(sync_app, "b", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 20)
        for job in jobs:  # done at once: the rate counts starts, not running jobs
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
        assert Counter(j.queue for j in jobs) == {"a": 3, "a2": 2, "b": 1}
        assert claim(sync_app, conn, 20) == []


def test_a_key_at_its_limit_never_keeps_other_keys_waiting(dsn: str, sync_app: jobbus.App) -> None:
    """The rotation once reached the last key, visited only the first one (at its limit) and took
    nothing: 4 keys were free, the claim took 0 and the next claims too."""
    sync_app.sync.set_queue("a", concurrency_per_key=1)
    _jobs(sync_app, "a", 3, key="a-big")  # sorts first, and runs
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _keys(conn, claim(sync_app, conn, 1)) == ["a-big"]
        for key in ("k1", "k2", "k3", "k4", "z-last"):
            _jobs(sync_app, "a", 1, key=key)
        first = claim(sync_app, conn, 5)
        assert _keys(conn, first) == ["k1", "k2", "k3", "k4", "z-last"]
        for job in first:
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
        for key in ("k1", "k2", "k3", "k4"):
            _jobs(sync_app, "a", 1, key=key)
        again = claim(sync_app, conn, 10)
        assert _keys(conn, again) == ["k1", "k2", "k3", "k4"]


def test_a_key_with_its_rate_spent_never_keeps_other_keys_waiting(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", rate_limit_per_key=jobbus.RateLimit(1, per=timedelta(hours=1)))
    _jobs(sync_app, "a", 3, key="a-big")  # sorts first, its budget spent by the first claim
    _jobs(sync_app, "a", 1, key="z-last")  # sorts last, served by the first claim
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _keys(conn, claim(sync_app, conn, 2)) == ["a-big", "z-last"]
        for round_ in range(3):
            keys = [f"k{round_}-{n}" for n in range(3)]
            for key in keys:
                _jobs(sync_app, "a", 1, key=key)
            assert _keys(conn, claim(sync_app, conn, 10)) == keys


def _keys(conn: psycopg.Connection[Any], jobs: list[ClaimedJob]) -> list[str]:
    rows = conn.execute("SELECT concurrency_key FROM jobbus.job WHERE id = ANY(%s)", ([j.id for j in jobs],))
    return sorted(key for (key,) in rows)


def _rows_read(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'jobbus' AND relname = %s",
        (table,),
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_keyed_claim_reads_what_it_takes_not_the_keys_at_their_limit(dsn: str, sync_app: jobbus.App) -> None:
    """10,000 keys at their limit, each with a job running and one queued, beside 5 keys that can run: a
    claim reads the rows of what it takes (and a few per key it takes from), not one row per key at its
    limit. Counted from the transaction's own table statistics, not timed."""
    saturated = 10_000
    sync_app.sync.set_queue("a", concurrency_per_key=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, concurrency_key)"
            " SELECT gen_random_uuid(), 't', 'a', 3, 'busy-' || lpad(n::text, 5, '0')"
            " FROM generate_series(1, %s) AS n, generate_series(1, 2)",
            (saturated,),
        )
        conn.execute("ANALYZE jobbus.job")
        taken = claim(sync_app, conn, saturated + 100)
        assert len(taken) == saturated  # one per key: now every key is at its limit
        _jobs(sync_app, "a", 1, key="free-1")
        for n in range(2, 6):
            _jobs(sync_app, "a", 1, key=f"free-{n}")
        # Jobs without a key are looked for at most once a second when there were none (a walk of the
        # queue, docs/flow-control.md): not what this counts.
        conn.execute("UPDATE jobbus.queue_setting SET unkeyed_at = now() + interval '1 hour'")
        with conn.transaction():
            before = {t: _rows_read(conn, t) for t in ("job", "queue_key", "queue_key_note", "queue_start")}
            jobs = claim(sync_app, conn, 50)
            read = {t: _rows_read(conn, t) - before[t] for t in before}
        assert _keys(conn, jobs) == [f"free-{n}" for n in range(1, 6)]
        assert sum(read.values()) < 200, read
        with conn.transaction():
            before = {t: _rows_read(conn, t) for t in ("job", "queue_key", "queue_key_note", "queue_start")}
            assert claim(sync_app, conn, 50) == []
            read = {t: _rows_read(conn, t) - before[t] for t in before}
        assert sum(read.values()) < 50, read


def test_a_claim_of_a_queue_without_limits_touches_nothing_of_flow_control(dsn: str, sync_app: jobbus.App) -> None:
    """SPEC 12: queues without limits pay nothing for them. Beside a queue with every kind of limit, a
    claim of a queue without any scans and writes none of the tables flow control keeps."""
    sync_app.sync.set_queue(
        "limited",
        concurrency=1,
        concurrency_per_key=1,
        rate_limit=jobbus.RateLimit(5, per=timedelta(minutes=1)),
        rate_limit_per_key=jobbus.RateLimit(5, per=timedelta(minutes=1)),
    )
    _jobs(sync_app, "limited", 3, key="k")
    _jobs(sync_app, "free", 5)
    tables = ("queue_setting", "queue_key", "queue_key_note", "queue_start")
    with psycopg.connect(dsn, autocommit=True) as conn:
        statement = claim_statement(sync_app, conn, 10, queues=["free"])
        with conn.transaction():
            before = {t: _touched(conn, t) for t in tables}
            jobs = run_sync(conn, statement).jobs
            touched = {t: _touched(conn, t) - before[t] for t in tables}
    assert [j.queue for j in jobs] == ["free"] * 5
    assert touched == dict.fromkeys(tables, 0)


def _touched(conn: psycopg.Connection[Any], table: str) -> int:
    """Scans and row writes of `table` by this transaction so far."""
    row = conn.execute(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) + n_tup_ins + n_tup_upd + n_tup_del"
        " FROM pg_stat_xact_user_tables WHERE schemaname = 'jobbus' AND relname = %s",
        (table,),
    ).fetchone()
    return int(row[0]) if row else 0


# A randomized topology: queues with random limits, claimers each serving a random subset of them on its
# own connection, claiming at once; every committed state must keep every limit.

LIMITS = st.fixed_dictionaries(
    {
        "concurrency": st.none() | st.integers(1, 4),
        "concurrency_per_key": st.none() | st.integers(1, 4),
        "rate": st.none() | st.tuples(st.integers(2, 6), st.sampled_from([0.5, 60.0])),
        "key_rate": st.none() | st.tuples(st.integers(1, 3), st.sampled_from([0.5, 60.0])),
        "keys": st.lists(st.sampled_from(["k0", "k1", "k2", "k3", None]), min_size=8, max_size=24),
    }
)
TOPOLOGY = st.fixed_dictionaries(
    {
        "queues": st.lists(LIMITS, min_size=1, max_size=4),
        "claimers": st.lists(
            st.tuples(st.sets(st.integers(0, 3), min_size=1), st.integers(1, 6), st.floats(0, 1)),
            min_size=2,
            max_size=4,
        ),
        "seed": st.integers(0, 2**16),
    }
)


def _reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM jobbus.queue_setting")  # and the keys it kept
    conn.execute("TRUNCATE jobbus.job, jobbus.queue_start")


def _check_leases(conn: psycopg.Connection[Any], limits: dict[str, dict[str, Any]]) -> None:
    rows = conn.execute(
        "SELECT queue, concurrency_key, count(*) FROM jobbus.job"
        " WHERE status = 'running' AND lease_expires_at > now() GROUP BY queue, concurrency_key"
    ).fetchall()
    total: Counter[str] = Counter()
    for queue, key, n in rows:
        total[queue] += n
        per_key = limits[queue]["concurrency_per_key"]
        if key is not None and per_key is not None:
            assert n <= per_key, f"{n} jobs of key {key} of {queue} hold a lease (limit {per_key})"
    for queue, n in total.items():
        limit = limits[queue]["concurrency"]
        assert limit is None or n <= limit, f"{n} jobs of {queue} hold a lease (limit {limit})"


def _check_rates(conn: psycopg.Connection[Any], limits: dict[str, dict[str, Any]]) -> None:
    rows = conn.execute("SELECT queue, concurrency_key, started_at FROM jobbus.job WHERE started_at IS NOT NULL")
    starts: dict[tuple[str, str | None], list[Any]] = {}
    for queue, key, started in rows:
        starts.setdefault((queue, None), []).append(started)
        if key is not None:
            starts.setdefault((queue, key), []).append(started)
    for (queue, key), times in starts.items():
        rate = limits[queue]["rate" if key is None else "key_rate"]
        if rate is None:
            continue
        count, per = rate
        times.sort()
        worst = max(sum(1 for t in times[i:] if (t - start).total_seconds() < per) for i, start in enumerate(times))
        assert worst <= count + 1, f"{worst} starts of {queue}/{key} within {per} s (limit {count})"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topology=TOPOLOGY)
def test_limits_hold_for_any_topology_of_queues_and_concurrent_claimers(
    dsn: str, sync_app: jobbus.App, topology: dict[str, Any]
) -> None:
    rng = random.Random(topology["seed"])
    limits = {f"q{n}": spec for n, spec in enumerate(topology["queues"])}
    with psycopg.connect(dsn, autocommit=True) as conn:
        _reset(conn)
        for queue, spec in limits.items():
            rate = spec["rate"] and jobbus.RateLimit(spec["rate"][0], per=timedelta(seconds=spec["rate"][1]))
            key_rate = spec["key_rate"] and jobbus.RateLimit(
                spec["key_rate"][0], per=timedelta(seconds=spec["key_rate"][1])
            )
            if spec["concurrency"] or spec["concurrency_per_key"] or rate or key_rate:
                sync_app.sync.set_queue(
                    queue,
                    concurrency=spec["concurrency"],
                    concurrency_per_key=spec["concurrency_per_key"],
                    rate_limit=rate,
                    rate_limit_per_key=key_rate,
                )
            half = len(spec["keys"]) // 2  # half before the claims start, half while they run
            for key in spec["keys"][:half]:
                _jobs(sync_app, queue, 1, key=key)
        late = [(queue, key) for queue, spec in limits.items() for key in spec["keys"][len(spec["keys"]) // 2 :]]
    errors: list[BaseException] = []
    start = threading.Barrier(len(topology["claimers"]) + 1)

    def claimer(number: int, served: set[int], limit: int, finish_share: float) -> None:
        queues = [f"q{n}" for n in served if f"q{n}" in limits] or ["q0"]
        held: list[ClaimedJob] = []
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait()
                for _ in range(25):
                    held += claim(sync_app, conn, limit, queues=queues, worker_id=f"w{number}")
                    _check_leases(conn, limits)
                    rng_local = random.Random(number * 1000 + len(held))
                    for job in [j for j in held if rng_local.random() < finish_share]:
                        held.remove(job)
                        write(sync_app, conn, job, JobStatus.COMPLETED)
                    time.sleep(0.01)
                for job in held:
                    write(sync_app, conn, job, JobStatus.COMPLETED)
        except BaseException as error:  # reported by the test's thread
            errors.append(error)

    threads = [
        threading.Thread(target=claimer, args=(n, served, limit, share))
        for n, (served, limit, share) in enumerate(topology["claimers"])
    ]
    for thread in threads:
        thread.start()
    start.wait()
    rng.shuffle(late)
    for queue, key in late:
        _jobs(sync_app, queue, 1, key=key)
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with psycopg.connect(dsn, autocommit=True) as conn:
        _check_rates(conn, limits)
        # What is not rate limited drains: no key waits behind another at its limit.
        drained = [q for q, spec in limits.items() if spec["rate"] is None and spec["key_rate"] is None]
        # Polling as a worker does: jobs without a key are looked for once a second when there were none.
        deadline = time.monotonic() + 60
        while left := conn.execute(
            "SELECT queue, count(*) FROM jobbus.job WHERE queue = ANY(%s) AND status <> 'completed' GROUP BY queue",
            (drained,),
        ).fetchall():
            assert time.monotonic() < deadline, f"left behind: {left}"
            jobs = claim(sync_app, conn, 10, queues=drained)
            _check_leases(conn, limits)
            for job in jobs:
                write(sync_app, conn, job, JobStatus.COMPLETED)
            if not jobs:
                time.sleep(0.1)


def test_a_key_at_its_limit_runs_again_as_soon_as_its_job_ends(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency_per_key=1)
    _jobs(sync_app, "a", 3, key="k")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(3):
            [job] = claim(sync_app, conn, 5)
            assert claim(sync_app, conn, 5) == []  # at its limit until the lease ends...
            assert write(sync_app, conn, job, JobStatus.COMPLETED)  # ...or the job does
        assert claim(sync_app, conn, 5) == []


@pytest.mark.parametrize("limit", ["concurrency", "concurrency_per_key"])
def test_an_expired_lease_frees_its_slot_before_the_job_is_recovered(
    dsn: str, sync_app: jobbus.App, limit: str
) -> None:
    """SPEC 12: a holder that stopped renewing (killed, frozen, cut off) keeps its row `running` until
    recovery runs, but its slot is free as soon as its lease is over."""
    if limit == "concurrency":
        sync_app.sync.set_queue("a", concurrency=1)
    else:
        sync_app.sync.set_queue("a", concurrency_per_key=1)
    _jobs(sync_app, "a", 2, key="k")
    with psycopg.connect(dsn, autocommit=True) as conn:
        [held] = claim(sync_app, conn, 5, lease_seconds=1)
        assert claim(sync_app, conn, 5) == []
        time.sleep(1.2)  # its holder never renews it
        [taken] = claim(sync_app, conn, 5)
        assert taken.id != held.id
        statuses: dict[uuid.UUID, str] = dict(conn.execute("SELECT id, status FROM jobbus.job").fetchall())
    assert statuses == {held.id: "running", taken.id: "running"}  # nothing recovered the first one


def test_a_job_due_later_or_waiting_for_its_retry_holds_no_slot(dsn: str, sync_app: jobbus.App) -> None:
    """SPEC 12: only a lease holds a slot. A job scheduled for later (even ahead by priority) and a job
    waiting for its retry backoff leave their queue's and their key's slot to a job that can run."""
    sync_app.sync.set_queue("a", concurrency=1, concurrency_per_key=1)
    later = sync_app.sync.schedule("t", queue="a", concurrency_key="k", priority=9, available_at=timedelta(hours=1))
    _jobs(sync_app, "a", 2, key="k")
    with psycopg.connect(dsn, autocommit=True) as conn:
        [first] = claim(sync_app, conn, 5)
        assert first.id != later
        assert write(sync_app, conn, first, JobStatus.QUEUED, error="again", delay_seconds=3600)
        [second] = claim(sync_app, conn, 5)
        assert second.id not in (later, first.id)
        assert claim(sync_app, conn, 5) == []  # the one running job holds the slot: the limit still holds
        waiting: dict[uuid.UUID, str] = dict(
            conn.execute("SELECT id, status FROM jobbus.job WHERE id <> %s", (second.id,)).fetchall()
        )
    assert waiting == {later: "queued", first.id: "queued"}


def test_a_job_enqueued_while_per_key_limits_are_set_is_not_lost(dsn: str, sync_app: jobbus.App) -> None:
    """A producer's transaction that adds a keyed job before the queue has per-key limits and commits
    after they are set: the change waits for it, and the job's key is kept."""
    with psycopg.connect(dsn) as producer, psycopg.connect(dsn, autocommit=True) as conn:
        producer.execute(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, concurrency_key)"
            " VALUES (gen_random_uuid(), 't', 'a', 3, 'k')"
        )
        setter = threading.Thread(target=lambda: sync_app.sync.set_queue("a", concurrency_per_key=1))
        setter.start()
        setter.join(timeout=1)
        assert setter.is_alive()  # waiting for the producer
        producer.commit()
        setter.join(timeout=30)
        assert not setter.is_alive()
        assert len(claim(sync_app, conn, 5)) == 1


# A queue-wide limit beside per-key limits: every combination, claimed again and again from several
# connections at once (jobs ending between claims), must keep the queue-wide limit as well as the keys'.

COMBINATIONS = {
    "per-key concurrency and queue rate": {"concurrency_per_key": 2, "rate": 3},
    "per-key concurrency and queue concurrency": {"concurrency_per_key": 2, "concurrency": 3},
    "per-key rate and queue rate": {"key_rate": 2, "rate": 3},
    "all four": {"concurrency_per_key": 2, "key_rate": 2, "concurrency": 3, "rate": 4},
}


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_a_queue_wide_limit_holds_beside_per_key_limits(dsn: str, sync_app: jobbus.App, name: str) -> None:
    spec = COMBINATIONS[name]
    hour = timedelta(hours=1)
    sync_app.sync.set_queue(
        "a",
        concurrency=spec.get("concurrency"),
        concurrency_per_key=spec.get("concurrency_per_key"),
        rate_limit=jobbus.RateLimit(spec["rate"], per=hour) if "rate" in spec else None,
        rate_limit_per_key=jobbus.RateLimit(spec["key_rate"], per=hour) if "key_rate" in spec else None,
    )
    for key in ("k0", "k1", "k2", "k3", "k4", None):
        _jobs(sync_app, "a", 4, key=key)
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def claimer(number: int, finish: bool) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait()
                for _ in range(20):
                    jobs = claim(sync_app, conn, 3, worker_id=f"w{number}")
                    _check_leases(conn, {"a": {"concurrency": None, "concurrency_per_key": None, **spec}})
                    if finish:  # a slot frees at once; a start stays in the rate window
                        for job in jobs:
                            assert write(sync_app, conn, job, JobStatus.COMPLETED)
        except BaseException as error:  # reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(n, n == 0)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with psycopg.connect(dsn, autocommit=True) as conn:
        starts = conn.execute("SELECT concurrency_key FROM jobbus.job WHERE started_at IS NOT NULL").fetchall()
        if "rate" in spec:
            assert len(starts) <= spec["rate"], f"{len(starts)} starts under a rate of {spec['rate']}"
        if "key_rate" in spec:
            per_key = Counter(key for (key,) in starts if key is not None)
            assert max(per_key.values(), default=0) <= spec["key_rate"], per_key
        if "concurrency" in spec:
            running = conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'running'").fetchone()
            assert running is not None and running[0] <= spec["concurrency"]
