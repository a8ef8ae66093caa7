"""Weights (`weight=N`) and `App.consume`: a job counts its weight against its queue's concurrency,
per-key concurrency and rate limits, exactly, with any number of claimers; spends count in the rate
windows; a job heavier than a limit is refused when scheduled, and a limit lowered below a queued job's
weight is refused; a spend repeated after a lost connection spends once."""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

import jobbus
from jobbus.models import ClaimedJob, JobStatus
from tests.cli import jobbus as cli
from tests.cutting_proxy import CuttingProxy
from tests.processes import wait_until
from tests.roles import granted_roles
from tests.storehelpers import claim, write
from tests.worker.test_flow_control import Sampler, _done, fleet


def _weighted(app: jobbus.App, queue: str, weights: list[int], *, key: str | None = None) -> list[uuid.UUID]:
    """Jobs of these weights, in this claim order (priorities fall as the list goes on)."""
    requests = [
        jobbus.JobRequest("t", {"n": n}, queue=queue, concurrency_key=key, weight=w, priority=-n)
        for n, w in enumerate(weights)
    ]
    return app.sync.schedule_many(requests)


def _running_weight(conn: psycopg.Connection[Any], queue: str, key: str | None = None) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(weight), 0) FROM jobbus.job WHERE queue = %s AND status = 'running'"
        " AND lease_expires_at > now() AND (%s::text IS NULL OR concurrency_key = %s::text)",
        (queue, key, key),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _weights(conn: psycopg.Connection[Any], jobs: list[ClaimedJob]) -> list[int]:
    rows = conn.execute("SELECT id, weight FROM jobbus.job WHERE id = ANY(%s)", ([j.id for j in jobs],)).fetchall()
    by_id = dict(rows)
    return [by_id[j.id] for j in jobs]


# -- concurrency ---------------------------------------------------------------------------------------


def test_a_claim_takes_the_claim_order_prefix_that_fits_the_concurrency(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency=5)
    _weighted(sync_app, "a", [3, 3, 1, 1])
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = claim(sync_app, conn, 10, queues=["a"])
        # 3 fits, the next 3 does not: the claim stops there (a heavy job is not passed over by light ones).
        assert _weights(conn, first) == [3]
        assert claim(sync_app, conn, 10, queues=["a"]) == []
        assert write(sync_app, conn, first[0], JobStatus.COMPLETED)
        assert sorted(_weights(conn, claim(sync_app, conn, 10, queues=["a"]))) == [1, 1, 3]
        assert _running_weight(conn, "a") == 5


def test_jobs_of_weight_one_take_every_slot_as_before(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency=4)
    _weighted(sync_app, "a", [1] * 10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert len(claim(sync_app, conn, 10, queues=["a"])) == 4
        assert claim(sync_app, conn, 10, queues=["a"]) == []


def test_a_weight_counts_against_the_concurrency_when_the_worker_serves_another_queue(
    dsn: str, sync_app: jobbus.App
) -> None:
    """A claim over two queues takes a share of each, then the rest: the second pass counts the weight of
    what the first took of the limited queue."""
    sync_app.sync.set_queue("a", concurrency=4)
    _weighted(sync_app, "a", [2, 2, 2, 2])
    _weighted(sync_app, "b", [5, 5])
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 6)
        assert sum(w for j, w in zip(jobs, _weights(conn, jobs), strict=True) if j.queue == "a") == 4
        assert sorted(j.queue for j in jobs) == ["a", "a", "b", "b"]  # b has no limit: weights do not matter


def test_a_per_key_limit_counts_weights_and_a_key_that_cannot_fit_waits_for_its_jobs_to_end(
    dsn: str, sync_app: jobbus.App
) -> None:
    sync_app.sync.set_queue("a", concurrency_per_key=3)
    _weighted(sync_app, "a", [2, 2, 1], key="k")
    _weighted(sync_app, "a", [3], key="other")
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 10, queues=["a"])
        assert _running_weight(conn, "a", "k") == 2  # 2 fits, 2 more would be 4 > 3
        assert _running_weight(conn, "a", "other") == 3  # a key that cannot fit never holds back another
        assert claim(sync_app, conn, 10, queues=["a"]) == []
        done = next(j for j in jobs if _weights(conn, [j]) == [2])
        assert write(sync_app, conn, done, JobStatus.COMPLETED)
        again = claim(sync_app, conn, 10, queues=["a"])
        assert _weights(conn, again) == [2, 1]  # at once: the ended job freed its key
        assert _running_weight(conn, "a", "k") == 3


# -- rate limits and consume ----------------------------------------------------------------------------


def test_a_rate_limit_counts_weights_and_spent_units(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", rate_limit=jobbus.RateLimit(10, per=timedelta(minutes=1)))
    _weighted(sync_app, "a", [4, 4, 4])
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 10, queues=["a"])
        assert _weights(conn, jobs) == [4, 4]  # 8 of 10 units; 4 more would be 12
        for job in jobs:
            assert write(sync_app, conn, job, JobStatus.COMPLETED)
        assert sync_app.sync.queue_usage() == {"a": (0, 8)}
    assert sync_app.sync.consume("a", 1) is True
    assert sync_app.sync.queue_usage() == {"a": (0, 9)}
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert claim(sync_app, conn, 10, queues=["a"]) == []


def test_spent_units_hold_claims_back_until_they_leave_the_window(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", rate_limit=jobbus.RateLimit(5, per=timedelta(seconds=2)))
    _weighted(sync_app, "a", [1, 1])
    assert sync_app.sync.consume("a", 5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert claim(sync_app, conn, 10, queues=["a"]) == []
        deadline = time.monotonic() + 10
        while not (jobs := claim(sync_app, conn, 10, queues=["a"])):
            assert time.monotonic() < deadline, "the spend never left the window"
            time.sleep(0.1)
        assert len(jobs) == 2


def test_a_spend_with_a_key_counts_against_the_key_and_the_queue(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue(
        "a",
        rate_limit=jobbus.RateLimit(10, per=timedelta(minutes=1)),
        rate_limit_per_key=jobbus.RateLimit(3, per=timedelta(minutes=1)),
    )
    _weighted(sync_app, "a", [1, 1, 1], key="k")
    _weighted(sync_app, "a", [1, 1, 1, 1], key="j")
    assert sync_app.sync.consume("a", 3, key="k")
    assert sync_app.sync.consume("a", 4)
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = claim(sync_app, conn, 10, queues=["a"])
    # k spent its 3; j may start 3; the queue has 10 - 7 = 3 left.
    assert sorted(j.configuration_data["n"] for j in jobs if j.configuration_data) == [0, 1, 2]
    assert len(jobs) == 3


def test_a_spend_on_a_queue_without_a_rate_limit_records_nothing(dsn: str, sync_app: jobbus.App) -> None:
    assert sync_app.sync.consume("nolimit", 5) is False
    sync_app.sync.set_queue("perkey", rate_limit_per_key=jobbus.RateLimit(3, per=timedelta(minutes=1)))
    assert sync_app.sync.consume("perkey", 2) is False  # no key: no window counts it
    assert sync_app.sync.consume("perkey", 2, key="k") is True
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT queue, concurrency_key, units FROM jobbus.queue_start").fetchall()
    assert rows == [("perkey", "k", 2)]


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        (("", 1), {}, "queue"),
        (("q" * 256, 1), {}, "queue"),
        (("a", 0), {}, "units"),
        (("a", -3), {}, "units"),
        (("a", 2**31), {}, "units"),
        (("a", 1.5), {}, "units"),
        (("a", True), {}, "units"),
        (("a", "3"), {}, "units"),
        (("a", 1), {"key": ""}, "key"),
        (("a", 1), {"key": 7}, "key"),
    ],
)
def test_consume_refuses_bad_arguments_naming_them(
    dsn: str, sync_app: jobbus.App, args: tuple[Any, ...], kwargs: dict[str, Any], named: str
) -> None:
    sync_app.sync.set_queue("a", rate_limit=jobbus.RateLimit(10, per=timedelta(minutes=1)))
    with pytest.raises(jobbus.InvalidJobError, match=named):
        sync_app.sync.consume(*args, **kwargs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.queue_start").fetchone() == (0,)


@pytest.mark.server("the proxy reaches the server over TCP; the embedded server listens on a Unix socket only")
async def test_a_spend_whose_answer_was_lost_after_its_commit_spends_once(dsn: str) -> None:
    proxy = CuttingProxy(dsn)
    await proxy.start()
    try:
        async with jobbus.App(dsn=proxy.dsn, database_wait_seconds=30) as app:
            await app.set_queue("a", rate_limit=jobbus.RateLimit(100, per=timedelta(minutes=1)))
            proxy.arm(b"spend_units")
            assert await app.consume("a", 7) is True
            assert proxy.cut == [b"spend_units"]
            assert await app.queue_usage() == {"a": (0, 7)}
    finally:
        await proxy.close()


# -- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "key", "weight", "named"),
    [
        ({"concurrency": 3}, None, 4, "concurrency of queue a (3)"),
        ({"rate_limit": jobbus.RateLimit(2, per=timedelta(seconds=1))}, None, 3, "rate_limit of queue a (2)"),
        ({"concurrency_per_key": 2}, "k", 3, "concurrency_per_key of queue a (2)"),
        ({"rate_limit_per_key": jobbus.RateLimit(5, per=timedelta(seconds=1))}, "k", 6, "rate_limit_per_key"),
    ],
)
def test_a_job_heavier_than_a_limit_of_its_queue_is_refused_naming_both_numbers(
    dsn: str, sync_app: jobbus.App, limits: dict[str, Any], key: str | None, weight: int, named: str
) -> None:
    sync_app.sync.set_queue("a", **limits)
    calls: list[Callable[[], object]] = [
        lambda: sync_app.sync.schedule("t", {}, queue="a", concurrency_key=key, weight=weight),
        lambda: sync_app.sync.schedule_many(
            [
                jobbus.JobRequest("t", queue="a", concurrency_key=key, weight=1),
                jobbus.JobRequest("t", queue="a", concurrency_key=key, weight=weight),
            ]
        ),
        lambda: sync_app.sync.schedule_many("t", [{}, {}], queue="a", concurrency_key=key, weight=weight),
        lambda: sync_app.sync.schedule(
            "t", {}, queue="b", then=jobbus.JobRequest("t", queue="a", concurrency_key=key, weight=weight)
        ),
    ]
    for call in calls:
        with pytest.raises(jobbus.InvalidJobError, match=rf"weight {weight} .*{re.escape(named)}"):
            call()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.job").fetchone() == (0,)
        with pytest.raises(
            psycopg.errors.InvalidParameterValue, match=rf"weight {weight} .*{re.escape(named)}"
        ) as refused:
            conn.execute(
                "SELECT jobbus.schedule('t', '{}', %s)",
                (Jsonb({"queue": "a", "concurrency_key": key, "weight": weight}),),
            )
        assert refused.value.diag.column_name == "weight"
        assert conn.execute("SELECT count(*) FROM jobbus.job").fetchone() == (0,)
    # At the limit is fine; per-key limits do not bind a job without a key.
    sync_app.sync.schedule("t", {}, queue="a", concurrency_key=key, weight=weight - 1)
    if key is not None:
        sync_app.sync.schedule("t", {}, queue="a", weight=weight)


def test_weight_is_validated_like_every_option(dsn: str, sync_app: jobbus.App) -> None:
    for bad in (0, -1, 1_000_001, 1.5, True, "2"):
        with pytest.raises(jobbus.InvalidJobError, match="weight"):
            sync_app.sync.schedule("t", {}, weight=bad)  # type: ignore[arg-type]
    job_id = sync_app.sync.schedule("t", {}, weight=1_000_000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT weight FROM jobbus.job WHERE id = %s", (job_id,)).fetchone() == (1_000_000,)
        assert conn.execute("SELECT count(*) FROM jobbus.job").fetchone() == (1,)


def test_lowering_a_limit_below_a_queued_weight_is_refused_naming_it(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency=10, concurrency_per_key=10)
    _weighted(sync_app, "a", [7, 2])
    _weighted(sync_app, "a", [4], key="k")
    with pytest.raises(jobbus.InvalidStateError, match="weight 7: a concurrency of 6"):
        sync_app.sync.set_queue("a", concurrency=6)
    with pytest.raises(jobbus.InvalidStateError, match="weight 7: a rate_limit of 5"):
        sync_app.sync.set_queue("a", rate_limit=jobbus.RateLimit(5, per=timedelta(seconds=1)))
    with pytest.raises(jobbus.InvalidStateError, match="weight 4: a concurrency_per_key of 3"):
        sync_app.sync.set_queue("a", concurrency_per_key=3)
    settings_now = sync_app.sync.get_queue("a")
    assert (settings_now.concurrency, settings_now.concurrency_per_key, settings_now.rate_limit) == (10, 10, None)
    sync_app.sync.set_queue("a", concurrency=7, concurrency_per_key=4)  # at the heaviest: fine
    sync_app.sync.set_queue("a", concurrency=None)  # removing a limit: fine
    with pytest.raises(jobbus.InvalidStateError, match="weight 7"):
        sync_app.sync.set_queue("a", concurrency=1)  # a limit added counts as lowered


def test_a_schedule_racing_a_limit_change_never_leaves_a_job_heavier_than_the_limit(
    dsn: str, sync_app: jobbus.App
) -> None:
    """Producers schedule jobs of weight 1-6 while an operator moves the limit between 1 and 6: whatever
    the interleaving, no queued job ends heavier than the limit it would wait for."""
    sync_app.sync.set_queue("a", concurrency=6)
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                with contextlib.suppress(jobbus.InvalidJobError):
                    sync_app.sync.schedule("t", {}, queue="a", weight=rng.randint(1, 6))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    rng = random.Random(7)
    try:
        for _ in range(60):
            with contextlib.suppress(jobbus.InvalidStateError):
                sync_app.sync.set_queue("a", concurrency=rng.randint(1, 6))
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM jobbus.job WHERE weight > 1 AND random() < 0.5")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    limit = sync_app.sync.get_queue("a").concurrency
    assert limit is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT max(weight) FROM jobbus.job WHERE status = 'queued'").fetchone()
    assert row is not None and (row[0] or 0) <= limit


# -- concurrent claimers -------------------------------------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    concurrency=st.integers(1, 6),
    per_key=st.none() | st.integers(1, 4),
    claimers=st.lists(st.tuples(st.booleans(), st.integers(1, 4)), min_size=2, max_size=3),
)
def test_weighted_limits_hold_with_claimers_racing(
    dsn: str,
    sync_app: jobbus.App,
    seed: int,
    concurrency: int,
    per_key: int | None,
    claimers: list[tuple[bool, int]],
) -> None:
    """Claimers (some also serving a queue without limits) take and finish weighted jobs at random; after
    every claim the weights of the jobs holding a valid lease stay within the queue's and each key's limit,
    and every job runs in the end."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobbus.job")
        conn.execute("DELETE FROM jobbus.queue_setting")
    sync_app.sync.set_queue("a", concurrency=concurrency, concurrency_per_key=per_key)
    top = min(concurrency, per_key or concurrency)
    requests = [
        jobbus.JobRequest(
            "t", queue="a", weight=rng.randint(1, top), concurrency_key=rng.choice([None, "k1", "k2", "k3"])
        )
        for _ in range(40)
    ]
    requests += [jobbus.JobRequest("t", queue="free", weight=rng.randint(1, 4)) for _ in range(10)]
    sync_app.sync.schedule_many(requests)
    errors: list[BaseException] = []
    seen: list[int] = []

    def check(conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT concurrency_key, sum(weight) FROM jobbus.job WHERE queue = 'a' AND status = 'running'"
            " AND lease_expires_at > now() GROUP BY concurrency_key"
        ).fetchall()
        total = sum(int(n) for _, n in rows)
        seen.append(total)
        assert total <= concurrency, rows
        if per_key is not None:
            assert all(int(n) <= per_key for key, n in rows if key is not None), rows

    def claimer(number: int, also_free: bool, limit: int) -> None:
        local = random.Random(seed + number)
        queues = ["a", "free"] if also_free or number == 0 else ["a"]
        held: list[ClaimedJob] = []
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    held += claim(sync_app, conn, limit, queues=queues, worker_id=f"w{number}")
                    check(conn)
                    for job in [j for j in held if local.random() < 0.5]:
                        held.remove(job)
                        assert write(sync_app, conn, job, JobStatus.COMPLETED)
                    left = conn.execute("SELECT count(*) FROM jobbus.job WHERE status <> 'completed'").fetchone()
                    if left == (0,):
                        return
                    time.sleep(0.002)
                for job in held:
                    write(sync_app, conn, job, JobStatus.COMPLETED)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(n, free, limit)) for n, (free, limit) in enumerate(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM jobbus.job WHERE status <> 'completed'").fetchone()
    assert left == (0,)
    assert max(seen) >= 1


def test_a_heavy_job_first_in_the_rotation_is_not_passed_over_by_lighter_keys(dsn: str, sync_app: jobbus.App) -> None:
    """Regression: a key whose next job fits its own limit but not what the queue leaves ends the claim,
    so the keys behind it in the rotation do not take the room it waits for (they did: under a steady
    stream of light jobs the heavy one could wait for ever)."""
    sync_app.sync.set_queue("a", concurrency=4, concurrency_per_key=4)
    _weighted(sync_app, "a", [1] * 6, key="light")
    _weighted(sync_app, "a", [4], key="heavy")
    with psycopg.connect(dsn, autocommit=True) as conn:
        (running,) = claim(sync_app, conn, 1, queues=["a"])  # light's turn: it goes to the back
        assert claim(sync_app, conn, 10, queues=["a"]) == []  # 3 slots free, kept for the heavy job
        assert write(sync_app, conn, running, JobStatus.COMPLETED)
        assert _weights(conn, claim(sync_app, conn, 10, queues=["a"])) == [4]


@pytest.mark.parametrize("also_free", [False, True], ids=["one-queue", "two-queues"])
def test_weighted_limits_hold_across_worker_processes_and_a_killed_one(
    dsn: str, sync_app: jobbus.App, also_free: bool
) -> None:
    """Real workers (one of them killed mid-way, its slots back when its leases expire): a sampler reading
    the running leases every few milliseconds never sees their weights above the queue's or a key's limit."""
    sync_app.sync.set_queue("limited", concurrency=4, concurrency_per_key=3)
    rng = random.Random(5)
    sync_app.sync.schedule_many(
        [
            jobbus.JobRequest(
                "work", queue="limited", weight=rng.randint(1, 3), concurrency_key=f"k{rng.randint(0, 3)}"
            )
            for _ in range(150)
        ]
    )
    sync_app.sync.schedule_many("free", [{} for _ in range(50)], queue="free")
    queues = ["--queue", "limited", "--queue", "free"] if also_free else ["--queue", "limited"]
    with WeightSampler(dsn) as sampler, fleet(dsn, 2, *queues) as procs:
        wait_until(lambda: _done(dsn) > 40, timeout=120, what="some done")
        procs[0].kill()
        wait_until(lambda: _done(dsn) == 150, timeout=240, what="every weighted job done")
    assert sampler.samples > 50
    assert sampler.max_total <= 4, f"saw weights of {sampler.max_total} holding a valid lease at once"
    assert sampler.max_per_key <= 3, f"saw weights of {sampler.max_per_key} of one key at once"
    assert sampler.max_total >= 3  # the limit was used, not just respected


class WeightSampler(Sampler):
    """`Sampler` of tests/worker/test_flow_control.py, summing weights instead of counting jobs."""

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT concurrency_key, sum(weight) FROM jobbus.job WHERE queue = 'limited'"
                    " AND status = 'running' AND lease_expires_at > now() GROUP BY concurrency_key"
                ).fetchall()
                self.max_total = max(self.max_total, sum(int(n) for _, n in rows))
                self.max_per_key = max([self.max_per_key, *(int(n) for key, n in rows if key is not None)])
                self.samples += 1
                time.sleep(0.003)


def test_the_command_line_refuses_a_limit_below_a_queued_weight(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("a", concurrency=5)
    sync_app.sync.schedule("t", {}, queue="a", weight=3)
    result = cli(dsn, "queue", "set", "a", "--concurrency", "2")
    assert result.returncode == 1, result.stderr
    assert "weight 3" in result.stderr and "concurrency of 2" in result.stderr
    assert sync_app.sync.get_queue("a").concurrency == 5
    assert cli(dsn, "queue", "set", "a", "--concurrency", "3").returncode == 0


def test_a_follow_up_keeps_its_weight(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.schedule("t", {}, queue="b", then=jobbus.JobRequest("t", {"then": True}, queue="b", weight=3))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (parent,) = claim(sync_app, conn, 1, queues=["b"])
        assert write(sync_app, conn, parent, JobStatus.COMPLETED)
        row = conn.execute("SELECT weight FROM jobbus.job WHERE configuration_data = '{\"then\": true}'").fetchone()
    assert row == (3,)


def test_roles_schedule_weighted_jobs_spend_and_set_limits(dsn: str, sync_app: jobbus.App) -> None:
    """The producer role schedules weighted jobs (the check runs as the schema's owner) and spends units;
    the operator role's lowered limit is refused with the weight named."""
    sync_app.sync.set_queue("a", concurrency=5, rate_limit=jobbus.RateLimit(100, per=timedelta(minutes=1)))
    with granted_roles(dsn, ("worker", "operator", "observer", "producer")) as roles:
        producer = jobbus.App(dsn=roles["producer"])
        try:
            producer.sync.schedule("t", {}, queue="a", weight=4)
            with pytest.raises(jobbus.InvalidJobError, match="weight 6"):
                producer.sync.schedule("t", {}, queue="a", weight=6)
            assert producer.sync.consume("a", 7) is True
        finally:
            producer.sync.close()
        operator = jobbus.App(dsn=roles["operator"])
        try:
            with pytest.raises(jobbus.InvalidStateError, match="weight 4"):
                operator.sync.set_queue("a", concurrency=3)
            operator.sync.set_queue("a", concurrency=4)
        finally:
            operator.sync.close()
    assert sync_app.sync.queue_usage() == {"a": (0, 7)}


async def test_a_spawned_child_keeps_its_weight_and_one_too_heavy_is_refused(dsn: str) -> None:
    outcomes: list[str] = []
    async with jobbus.App(dsn=dsn, retry_base_delay_seconds=0, retry_max_delay_seconds=0) as app:

        @app.job("parent", queue="p")
        async def parent(job: jobbus.JobExecution) -> None:
            await job.spawn("child", {}, queue="c", weight=2)
            try:
                await job.spawn("child", {"heavy": True}, queue="c", weight=4)
            except jobbus.InvalidJobError as exc:
                outcomes.append(str(exc))

        @app.job("child", queue="c")
        async def child(job: jobbus.JobExecution) -> None:
            pass

        await app.set_queue("c", concurrency=3)
        await app.schedule("parent", {}, queue="p")
        await app.run_worker(stop_when_empty=True)
    assert len(outcomes) == 1 and "weight 4 is more than the concurrency of queue c (3)" in outcomes[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT type, weight, status FROM jobbus.job ORDER BY type").fetchall()
    assert rows == [("child", 2, "completed"), ("parent", 1, "completed")]


def test_task_options_and_a_group_callback_carry_weights(dsn: str, sync_app: jobbus.App) -> None:
    @sync_app.task(queue="a")
    def report(pages: int) -> None: ...

    sync_app.sync.set_queue("a", concurrency=3)
    job_id = report.options(weight=3).defer_sync(5)
    with pytest.raises(jobbus.InvalidJobError, match="weight 4"):
        report.options(weight=4).defer_sync(5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT weight FROM jobbus.job WHERE id = %s", (job_id,)).fetchone() == (3,)
    with pytest.raises(jobbus.InvalidJobError, match="weight 9"):
        sync_app.sync.schedule_group(
            [jobbus.JobRequest("t", queue="b")], then=jobbus.JobRequest("t", queue="a", weight=9)
        )
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.job_group").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM jobbus.job WHERE queue = 'b'").fetchone() == (0,)


def test_lowering_a_limit_below_a_waiting_follow_up_or_group_callback_is_refused(
    dsn: str, sync_app: jobbus.App
) -> None:
    """A follow-up (`then=`) waiting for its parent, and a group's callback waiting for its group, are
    jobs of the queue too: a limit lowered below their weight would leave them waiting for ever."""
    sync_app.sync.set_queue("a", concurrency=5)
    sync_app.sync.schedule("t", {}, queue="b", then=jobbus.JobRequest("t", queue="a", weight=4))
    with pytest.raises(jobbus.InvalidStateError, match="weight 4: a concurrency of 3"):
        sync_app.sync.set_queue("a", concurrency=3)
    sync_app.sync.schedule_group([jobbus.JobRequest("t", queue="b")], then=jobbus.JobRequest("t", queue="a", weight=5))
    with pytest.raises(jobbus.InvalidStateError, match="weight 5: a concurrency of 4"):
        sync_app.sync.set_queue("a", concurrency=4)
    assert sync_app.sync.get_queue("a").concurrency == 5


def test_the_weight_check_is_validated_by_the_migration(dsn: str) -> None:
    """Added NOT VALID, then validated after the migration's transaction committed: valid at the end."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT conname, convalidated FROM pg_constraint WHERE conname IN ('job_weight_check',"
            " 'queue_start_units_check') ORDER BY conname"
        ).fetchall()
        assert rows == [("job_weight_check", True), ("queue_start_units_check", True)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO jobbus.job (id, type, max_attempts, weight) VALUES (gen_random_uuid(), 't', 1, 0)"
            )


def test_a_job_reads_back_with_its_weight_and_jobs_show_prints_it(dsn: str, sync_app: jobbus.App) -> None:
    heavy = sync_app.sync.schedule("t", weight=4, tags=["w"])
    plain = sync_app.sync.schedule("t")
    found = sync_app.sync.find(heavy)
    assert found is not None and found.weight == 4 and found.tags == ("w",)
    assert {job.id: job.weight for job in sync_app.sync.list_jobs(type="t")} == {heavy: 4, plain: 1}
    shown = cli(dsn, "jobs", "show", str(heavy))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"weight\s+4\b", shown.stdout), shown.stdout
