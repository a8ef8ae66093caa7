"""What a worker leaves to Python's garbage collector: no attempt is a reference cycle (reference
counting frees each when it ends), and the collector runs at the worker's pace only while a worker runs."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator

import pytest

import jobbus
from jobbus.worker import collector
from jobbus.worker.attempt import Attempt
from jobbus.worker.collector import YOUNG_THRESHOLD, worker_pace
from tests.conftest import FAST


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off, after a collection: what only it would free stays in `gc.get_objects()`."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _alive(kind: type) -> int:
    return sum(1 for obj in gc.get_objects() if isinstance(obj, kind))


async def test_ended_attempts_are_freed_by_reference_counting(dsn: str, collector_off: None) -> None:
    app = jobbus.App(dsn=dsn, **FAST)
    thresholds: list[tuple[int, int, int]] = []

    @app.job("quick")
    async def quick(job: jobbus.JobExecution) -> int:
        thresholds.append(gc.get_threshold())
        await job.checkpoint({"at": job.attempt})  # a call through the attempt's execution
        return job.attempt

    @app.job("in-thread")
    def in_thread(job: jobbus.SyncJobExecution) -> str:
        return job.type

    @app.job("failing", max_attempts=1)
    async def failing(job: jobbus.JobExecution) -> None:
        raise ValueError("refused")

    async with app:
        await app.schedule_many("quick", [{}] * 60)
        await app.schedule_many("in-thread", [{}] * 30)
        await app.schedule_many("failing", [{}] * 30)
        counts = await app.drain(concurrency=20)
        assert counts == {"completed": 90, "failed": 30}
        await asyncio.sleep(0)
        left = _alive(Attempt), _alive(jobbus.JobExecution)  # the failures' log records hold theirs
        gc.collect()
        # Each attempt was a cycle (attempt → execution → its calls → attempt) that only the collector
        # freed, a dozen objects per job.
        assert (_alive(Attempt), _alive(jobbus.JobExecution)) == left
    assert {threshold[0] for threshold in thresholds} == {YOUNG_THRESHOLD}


def test_the_pace_lasts_while_any_worker_runs_and_the_hosts_setting_comes_back() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with worker_pace():
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
            with worker_pace():  # a second worker of the same process
                pass
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)  # the first one still runs
        assert gc.get_threshold() == (700, 10, 10)

        with worker_pace():
            gc.set_threshold(20_000, 5, 5)  # the host sets its own while the worker runs: it is kept
        assert gc.get_threshold() == (20_000, 5, 5)

        gc.set_threshold(200_000, 10, 10)  # a host that collects less often than the worker would
        with worker_pace():
            assert gc.get_threshold() == (200_000, 10, 10)
        assert gc.get_threshold() == (200_000, 10, 10)
    finally:
        gc.set_threshold(*before)


def test_workers_starting_and_stopping_in_many_threads_leave_the_hosts_setting() -> None:
    """Workers of one process in threads of their own (one event loop each) enter and leave the pace at
    once: the count of running workers stays exact, and the last to leave restores the host's setting."""
    before, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(700, 10, 10)
    sys.setswitchinterval(1e-6)  # a thread switch between any two bytecodes, as often as it can
    barrier = threading.Barrier(8)
    seen: list[tuple[int, int, int]] = []

    def worker() -> None:
        barrier.wait()
        for _ in range(2_000):
            with worker_pace():
                seen.append(gc.get_threshold())

    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert collector._workers == 0
        assert gc.get_threshold() == (700, 10, 10)
        assert {threshold[0] for threshold in seen} == {YOUNG_THRESHOLD}
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*before)
