"""Flow control across real worker processes: a sampler reading the running leases every few
milliseconds never sees a limit exceeded; rate limits hold in every rolling window; keys are served
fairly; SIGKILLed workers' slots come back after their lease."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg

import jobbus
from tests.processes import finish, query, start_worker, wait_until

APP = "tests.flow_apps:app"
FULL = os.environ.get("JOBBUS_FULL_FAULTS") == "1"
QUICK = {
    "JOBBUS_LEASE_SECONDS": "2",
    "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.3",
    "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "60",
}


class Sampler:
    """Reads, every few milliseconds, how many jobs of the queue hold a valid lease, in total and per key."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.max_total = 0
        self.max_per_key = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT concurrency_key, count(*) FROM jobbus.job WHERE queue = 'limited' AND status = 'running'"
                    " AND lease_expires_at > now() GROUP BY concurrency_key"
                ).fetchall()
                self.max_total = max(self.max_total, sum(n for _, n in rows))
                self.max_per_key = max([self.max_per_key, *(n for key, n in rows if key is not None)])
                self.samples += 1
                time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def fleet(dsn: str, count: int, *args: str) -> Iterator[list[Any]]:
    procs = [start_worker(dsn, "--concurrency", "4", *args, env=QUICK, app=APP) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                finish(proc, timeout=30)
            finally:
                proc.kill()


def _done(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM jobbus.job WHERE queue = 'limited' AND status = 'completed'")[0][0])


def test_a_queue_concurrency_limit_holds_across_eight_workers_and_killed_ones(dsn: str, sync_app: jobbus.App) -> None:
    jobs = 3000 if FULL else 600
    sync_app.sync.set_queue("limited", concurrency=3)
    sync_app.sync.schedule_many("work", [{} for _ in range(jobs)], queue="limited")
    with Sampler(dsn) as sampler, fleet(dsn, 8) as procs:
        wait_until(lambda: _done(dsn) > jobs // 4, timeout=120, what="a quarter done")
        for proc in procs[:2]:  # their leases expire: their slots come back, the limit still holds
            proc.kill()
        wait_until(lambda: _done(dsn) == jobs, timeout=240, what="every job done")
    assert sampler.samples > 100
    assert sampler.max_total == 3, f"saw {sampler.max_total} jobs holding a valid lease at once"


def test_a_per_key_limit_of_one_serialises_each_of_fifty_keys(dsn: str, sync_app: jobbus.App) -> None:
    per_key = 40 if FULL else 12
    sync_app.sync.set_queue("limited", concurrency_per_key=1)
    requests = [
        jobbus.JobRequest("work", {}, queue="limited", concurrency_key=f"tenant-{n % 50}") for n in range(50 * per_key)
    ]
    random.Random(7).shuffle(requests)
    sync_app.sync.schedule_many(requests)
    with Sampler(dsn) as sampler, fleet(dsn, 8):
        wait_until(lambda: _done(dsn) == len(requests), timeout=240, what="every job done")
    assert sampler.max_per_key == 1, f"saw {sampler.max_per_key} jobs of one key at once"
    assert sampler.max_total > 8  # keys ran side by side


def test_a_rate_limit_holds_in_every_rolling_window_and_runs_at_its_rate(dsn: str, sync_app: jobbus.App) -> None:
    rate, seconds = 50, (20 if FULL else 6)
    sync_app.sync.set_queue("limited", rate_limit=jobbus.RateLimit(rate, per=timedelta(seconds=1)))
    sync_app.sync.schedule_many("work", [{"max_sleep": 0.01} for _ in range(rate * seconds * 2)], queue="limited")
    with fleet(dsn, 4):
        wait_until(lambda: _done(dsn) > 0, timeout=60, what="the first job")
        time.sleep(seconds)
    starts = [r[0] for r in query(dsn, "SELECT started_at FROM jobbus.job WHERE started_at IS NOT NULL ORDER BY 1")]
    assert len(starts) > rate
    worst = max(sum(1 for t in starts[i:] if (t - start).total_seconds() < 1.0) for i, start in enumerate(starts))
    assert worst <= rate + 1, f"{worst} jobs started within one second"
    # The long-run rate over whole windows from the first start (a sliding window lets each window's
    # starts come together, so a partial last window would skew a plain average).
    windows = int((starts[-1] - starts[0]).total_seconds())
    within = sum(1 for t in starts if (t - starts[0]).total_seconds() < windows)
    assert abs(within / windows - rate) <= rate * 0.05, f"{within} starts in {windows} s"


def test_claims_rotate_across_keys_so_a_big_key_never_delays_small_ones(dsn: str, sync_app: jobbus.App) -> None:
    big = 20_000 if FULL else 3_000
    sync_app.sync.set_queue("limited", concurrency_per_key=2)
    sync_app.sync.schedule_many(
        "work", [{"max_sleep": 0.01} for _ in range(big)], queue="limited", concurrency_key="big"
    )
    small = [jobbus.JobRequest("work", {}, queue="limited", concurrency_key=f"small-{n % 20}") for n in range(100)]
    sync_app.sync.schedule_many(small)
    with fleet(dsn, 4):
        wait_until(
            lambda: (
                query(
                    dsn,
                    "SELECT count(*) FROM jobbus.job WHERE concurrency_key LIKE 'small-%%' AND status = 'completed'",
                )[0][0]
                == 100
            ),
            timeout=120,
            what="the small keys",
        )
    last_small = query(dsn, "SELECT max(finished_at) FROM jobbus.job WHERE concurrency_key LIKE 'small-%%'")[0][0]
    big_done_before = query(
        dsn, "SELECT count(*) FROM jobbus.job WHERE concurrency_key = 'big' AND finished_at <= %s", (last_small,)
    )[0][0]
    assert big_done_before < 200, f"the big key finished {big_done_before} jobs before the small keys were done"


def test_a_queue_without_limits_beside_a_limited_one_is_not_held_back(dsn: str, sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("limited", concurrency=1)
    sync_app.sync.schedule_many("work", [{"max_sleep": 0.5} for _ in range(40)], queue="limited")
    sync_app.sync.schedule_many("free", [{} for _ in range(300)], queue="free")
    with fleet(dsn, 2):
        wait_until(
            lambda: (
                query(dsn, "SELECT count(*) FROM jobbus.job WHERE queue = 'free' AND status = 'completed'")[0][0] == 300
            ),
            timeout=60,
        )
        assert _done(dsn) < 40  # the limited queue is still working through its one slot


def test_a_limit_set_while_a_worker_runs_binds_it_within_one_poll_interval(dsn: str, sync_app: jobbus.App) -> None:
    """SPEC 12: limits apply to workers already running within one poll interval (1 s here), with no
    restart: several jobs at once before the change, never more than one after it."""
    sync_app.sync.schedule_many("work", [{"max_sleep": 0.3} for _ in range(60)], queue="limited")
    with fleet(dsn, 1, "--poll-interval", "1"):
        with Sampler(dsn) as before:
            wait_until(lambda: _done(dsn) >= 12, timeout=60, what="jobs to run without a limit")
        sync_app.sync.set_queue("limited", concurrency=1)
        time.sleep(1.0 + 2.0)  # one poll interval, then the jobs started before it end (0.3 s, on a loaded machine)
        with Sampler(dsn) as after:
            wait_until(lambda: _done(dsn) == 60, timeout=120, what="every job done")
    assert before.max_total > 1
    assert after.samples > 100
    assert after.max_total == 1, f"saw {after.max_total} jobs holding a valid lease at once"
