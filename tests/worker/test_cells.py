"""One worker process serving several cells (SPEC 23): one concurrency budget, fairness, a cell that is
down, signals, `stop_when_empty`, `limit` and the `cell` in logs and metrics. Each cell is a database of
the test server, with one ordinary App per cell sharing the same handlers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import jobbus
from jobbus.worker.cells import CellWorkers, run_cell_workers
from tests.cutting_proxy import CuttingProxy
from tests.dbserver import ROOT, fresh_database
from tests.processes import eventually, prepare, query, wait_until

FAST: dict[str, Any] = {
    "retry_base_delay_seconds": 0.0,
    "retry_max_delay_seconds": 0.0,
    "poll_interval_seconds": 0.2,
    "database_wait_seconds": 1.0,
}


class Recorder:
    """What the handlers of every cell did: starts and ends in order, and how many ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.started: list[tuple[str, str]] = []  # (cell, job id), in start order
        self.ended: list[tuple[str, str]] = []

    def start(self, cell: str, job_id: uuid.UUID) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.started.append((cell, str(job_id)))

    def end(self, cell: str, job_id: uuid.UUID) -> None:
        with self.lock:
            self.running -= 1
            self.ended.append((cell, str(job_id)))

    def count(self, events: list[tuple[str, str]], cell: str) -> int:
        with self.lock:
            return sum(1 for name, _ in events if name == cell)


def cell_app(cell: str, dsn: str, recorder: Recorder) -> jobbus.App:
    """One cell's App: every cell registers the same handlers."""
    app = jobbus.App(dsn=dsn, **FAST)

    @app.job("work")
    async def work(job: jobbus.JobExecution) -> None:
        recorder.start(cell, job.id)
        try:
            await asyncio.sleep(float(job.configuration.get("seconds", 0.005)))
        finally:
            recorder.end(cell, job.id)

    @app.job("batched", batch_size=5, batch_wait=0.05)
    async def batched(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        recorder.start(cell, batch[0].id)  # a batch holds one slot
        try:
            await asyncio.sleep(0.01)
        finally:
            recorder.end(cell, batch[0].id)

    @app.job("blocking")
    def blocking(job: jobbus.SyncJobExecution) -> None:
        import time

        recorder.start(cell, job.id)
        try:
            time.sleep(float(job.configuration.get("seconds", 0.005)))
        finally:
            recorder.end(cell, job.id)

    return app


@pytest.fixture
def databases(admin_dsn: str, template_db: str) -> Iterator[Callable[[int], list[str]]]:
    """`databases(n)`: n fresh, migrated databases of the test server (one per cell), dropped after."""
    with contextlib.ExitStack() as stack:

        def make(count: int) -> list[str]:
            return [stack.enter_context(fresh_database(admin_dsn, template_db)) for _ in range(count)]

        yield make


@contextlib.asynccontextmanager
async def opened(apps: dict[str, jobbus.App]) -> AsyncIterator[dict[str, jobbus.App]]:
    """The tests' own use of each cell's App (scheduling, reading), beside the workers'."""
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app)
        yield apps


def options(**values: Any) -> jobbus.WorkerOptions:
    return jobbus.WorkerOptions(**{"poll_interval": 0.2, "shutdown_timeout": 5.0} | values)


async def statuses(app: jobbus.App) -> dict[str, int]:
    async with app.pool.connection() as conn:
        rows = await (await conn.execute("SELECT status, count(*) FROM jobbus.job GROUP BY status")).fetchall()
    return {str(status): int(count) for status, count in rows}


async def all_completed(app: jobbus.App, count: int, what: str) -> None:
    """Wait until the cell's `count` jobs are completed (their outcomes are written after their handlers end)."""
    await eventually(lambda: _equal(statuses(app), {"completed": count}), timeout=60, what=what)


async def _equal(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


# -- one budget -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cells", "budget"), [(2, 3), (3, 4), (3, 2)])
async def test_jobs_of_every_cell_run_once_within_one_concurrency_budget(
    databases: Callable[[int], list[str]], cells: int, budget: int
) -> None:
    recorder = Recorder()
    names = [f"c{n}" for n in range(cells)]
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip(names, databases(cells), strict=True)}
    rng = random.Random(cells * 100 + budget)
    scheduled: dict[str, list[uuid.UUID]] = {}
    async with opened(apps):
        for name, app in apps.items():
            ids = await app.schedule_many("work", [{"seconds": rng.uniform(0.005, 0.03)} for _ in range(25)])
            ids += await app.schedule_many("blocking", [{"seconds": rng.uniform(0.005, 0.03)} for _ in range(5)])
            scheduled[name] = ids

        assert await run_cell_workers(apps, options(concurrency=budget, stop_when_empty=True)) == 0

        for name, app in apps.items():
            assert await statuses(app) == {"completed": 30}, name
    started = sorted(recorder.started)
    assert len(started) == len(set(started)) == 30 * cells  # every job ran, and ran once
    assert {cell for cell, _ in started} == set(names)
    assert recorder.peak <= budget  # never more handlers at once than the one budget, across the cells
    assert recorder.peak == budget  # and the budget was used


async def test_a_worker_of_one_database_refuses_cells() -> None:
    app = jobbus.App(dsn="postgresql://localhost/none")

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        pass

    with pytest.raises(ValueError, match="cells: a Worker serves one database"):
        jobbus.Worker(app, jobbus.WorkerOptions(cells=["a"]))


async def test_an_unknown_cell_is_refused_naming_it(databases: Callable[[int], list[str]]) -> None:
    recorder = Recorder()
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip("ab", databases(2), strict=True)}
    with pytest.raises(ValueError, match=r"unknown cell zz \(the cells are: a, b\)"):
        await run_cell_workers(apps, options(cells=["a", "zz"]))


# -- fairness ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_busy_cell_does_not_starve_another(databases: Callable[[int], list[str]], seed: int) -> None:
    """The big cell borrows every slot while the others are empty; once a small cell has jobs, slots
    come back to it: all its jobs start before the big cell's are half done."""
    rng = random.Random(seed)
    cells, budget = rng.randint(2, 3), rng.randint(2, 6)
    big, small = rng.randint(8_000, 10_000), rng.randint(20, 60)
    recorder = Recorder()
    names = ["big", *(f"small{n}" for n in range(cells - 1))]
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip(names, databases(cells), strict=True)}
    async with opened(apps):
        await apps["big"].schedule_many("work", [{"seconds": 0.01} for _ in range(big)])
        workers = CellWorkers(apps, options(concurrency=budget))
        task = asyncio.create_task(workers.run())
        try:
            # The big cell alone has jobs: it uses the whole budget.
            await eventually(lambda: recorder.running == budget, what="the big cell using every slot")
            done_before = recorder.count(recorder.ended, "big")
            for name in names[1:]:
                await apps[name].schedule_many("work", [{"seconds": 0.005} for _ in range(small)])
            await eventually(
                lambda: all(recorder.count(recorder.started, name) == small for name in names[1:]),
                what="every small cell's jobs started",
            )
            big_done = recorder.count(recorder.ended, "big")
        finally:
            workers.request_stop()
            assert await task == 0
    assert big_done - done_before < big / 2, (cells, budget, big, small, big_done)
    assert recorder.peak <= budget


class Claims:
    """A worker observer of each cell writing every claim, in the order the claim loops took them."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def of(self, cell: str) -> jobbus.worker.observer.WorkerObserver:
        claims = self

        class Observer:
            def job_claimed(self, job: Any, waited_seconds: float) -> None:
                claims.order.append(cell)

            def job_finished(self, job: Any, outcome: str, seconds: float) -> None:
                pass

            def queues_sampled(self, samples: Any) -> None:
                pass

            def leadership_changed(self, is_leader: bool) -> None:
                pass

        return Observer()


@pytest.mark.parametrize("seed", [4, 5, 6])
async def test_slots_a_busy_cell_frees_go_to_a_waiting_cell_until_it_has_its_guarantee(
    databases: Callable[[int], list[str]], seed: int
) -> None:
    """Once a cell with jobs waits for the slots a busy cell borrowed, the busy cell claims nothing more
    until the waiting cell has its guarantee (beyond a claim already in flight)."""
    rng = random.Random(seed)
    cells, budget = rng.randint(2, 3), rng.randint(4, 8)
    guarantee = budget // cells
    recorder, claims = Recorder(), Claims()
    names = ["big", "small", *(f"idle{n}" for n in range(cells - 2))]
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip(names, databases(cells), strict=True)}
    async with opened(apps):
        await apps["big"].schedule_many("work", [{"seconds": 0.02} for _ in range(5_000)])
        workers = CellWorkers(
            apps, options(concurrency=budget, shutdown_timeout=0.5), observers={n: [claims.of(n)] for n in names}
        )
        task = asyncio.create_task(workers.run())
        try:
            await eventually(lambda: recorder.running == budget, what="the big cell using every slot")
            await apps["small"].schedule_many("work", [{"seconds": 60} for _ in range(guarantee)])
            await eventually(lambda: claims.order.count("small") == guarantee, what="the small cell's guarantee")
        finally:
            workers.request_stop()
            assert await task == 0
    first = claims.order.index("small")
    last = len(claims.order) - 1 - claims.order[::-1].index("small")
    between = claims.order[first:last].count("big")
    assert between <= 1, (cells, budget, claims.order[first : last + 1])


# -- a cell that is down ----------------------------------------------------------------------------


def get_json(url: str) -> tuple[int, Any]:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.server("the proxy reaches the server over TCP; the embedded server listens on a Unix socket only")
async def test_a_cell_unreachable_at_start_does_not_stop_the_others_and_starts_once_it_is_back(
    databases: Callable[[int], list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobbus.worker")
    recorder = Recorder()
    up, later = databases(2)
    proxy = CuttingProxy(later)
    await proxy.start()
    proxy.black_out()  # the cell "later" cannot be reached when the worker starts
    nowhere = f"postgresql://postgres@127.0.0.1:{closed_port()}/nothing?connect_timeout=1"
    apps = {
        "up": cell_app("up", up, recorder),
        "later": cell_app("later", proxy.dsn, recorder),
        "nowhere": cell_app("nowhere", nowhere, recorder),
    }
    serving = {"up": apps["up"], "later": cell_app("later", later, recorder)}  # the tests' own, direct
    port = closed_port()
    try:
        async with opened(serving):
            await serving["later"].schedule_many("work", [{} for _ in range(5)])
            workers = CellWorkers(apps, options(concurrency=4, health_port=port))
            task = asyncio.create_task(workers.run())
            try:
                first = await serving["up"].schedule_many("work", [{} for _ in range(10)])
                await all_completed(serving["up"], len(first), "the up cell's jobs")
                assert recorder.count(recorder.started, "later") == 0
                reports = [r for r in caplog.records if getattr(r, "cell", None) in ("later", "nowhere")]
                assert {r.cell for r in reports if "cannot be reached" in r.getMessage()} == {  # type: ignore[attr-defined]
                    "later",
                    "nowhere",
                }
                # The process is ready: one cell's worker is; the answer names each cell's state.
                code, body = await asyncio.to_thread(get_json, f"http://127.0.0.1:{port}/readyz")
                assert code == 200, body
                assert body["cells"] == {"up": "running", "later": "unreachable", "nowhere": "unreachable"}

                proxy.black_out(False)  # the cell comes back: its worker starts, its jobs run
                await all_completed(serving["later"], 5, "the later cell's jobs")
                assert any(
                    "can be reached again" in r.getMessage() and getattr(r, "cell", None) == "later"
                    for r in caplog.records
                )
                assert task.done() is False  # the cell still down keeps nothing from running
            finally:
                workers.request_stop()
                assert await asyncio.wait_for(task, 30) == 0
    finally:
        await proxy.close()


@pytest.mark.parametrize("how", ["terminated", "renamed", "dropped"])
async def test_a_cell_lost_mid_run_does_not_stop_the_others_and_recovers(
    databases: Callable[[int], list[str]],
    admin_dsn: str,
    template_db: str,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="jobbus.worker")
    recorder = Recorder()
    steady, lost = databases(2)
    lost_name = str(psycopg.conninfo.conninfo_to_dict(lost)["dbname"])
    apps = {"steady": cell_app("steady", steady, recorder), "lost": cell_app("lost", lost, recorder)}
    workers = CellWorkers(apps, options(concurrency=4))
    task = asyncio.create_task(workers.run())
    try:
        await eventually(lambda: set(workers.workers) == {"steady", "lost"}, what="both cells' workers")
        await asyncio.gather(*(worker.ready() for worker in workers.workers.values()))
        away = f"{lost_name}_away"
        with psycopg.connect(admin_dsn, autocommit=True) as admin:

            def cut() -> None:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (lost_name,),
                )

            if how == "terminated":
                cut()
            elif how == "renamed":  # the workers reconnect at once: terminate and rename until it is away
                rename = sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(lost_name), sql.Identifier(away)
                )

                def cut_and_rename() -> None:
                    cut()
                    admin.execute(rename)

                await _until_done(cut_and_rename)
            else:
                admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(lost_name)))

            # While the cell is away, the other is served.
            async with opened({"steady": cell_app("steady", steady, recorder)}) as steady_only:
                ids = await steady_only["steady"].schedule_many("work", [{} for _ in range(10)])
                await all_completed(steady_only["steady"], len(ids), "the steady cell's jobs")
            assert not task.done()

            if how == "renamed":
                undo = sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(away), sql.Identifier(lost_name))
                await _until_done(lambda: admin.execute(undo))
            elif how == "dropped":  # back, empty but with the whole schema
                admin.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(lost_name), sql.Identifier(template_db)
                    )
                )

        # The cell is back: its worker, which kept retrying alone, runs its jobs again.
        async with opened({"lost": cell_app("lost", lost, recorder)}) as back:
            await back["lost"].schedule_many("work", [{} for _ in range(5)])
            await all_completed(back["lost"], 5, "the lost cell's jobs")
        if how != "terminated":
            assert any(getattr(r, "cell", None) == "lost" for r in caplog.records)  # its outage, with its cell
    finally:
        workers.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        with psycopg.connect(admin_dsn, autocommit=True) as admin:  # dropped by its fixture under its name
            for name in (f"{lost_name}_away",):
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def _until_done(action: Callable[[], Any], timeout: float = 20) -> None:
    """Run `action` until it does not raise (a database being renamed while its clients reconnect)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            action()
            return
        except psycopg.errors.ObjectInUse:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.01)


# -- the process's stop conditions ------------------------------------------------------------------


async def test_limit_counts_the_jobs_of_every_cell(databases: Callable[[int], list[str]]) -> None:
    recorder = Recorder()
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip("ab", databases(2), strict=True)}
    async with opened(apps):
        for app in apps.values():
            await app.schedule_many("work", [{} for _ in range(10)])
        assert await run_cell_workers(apps, options(concurrency=4, limit=7)) == 0
        completed = [(await statuses(app)).get("completed", 0) for app in apps.values()]
        assert sum(completed) == 7
        assert await run_cell_workers(apps, options(concurrency=4, run_once=True)) == 0
        completed = [(await statuses(app)).get("completed", 0) for app in apps.values()]
        assert sum(completed) == 8
    assert len(recorder.started) == 8


async def test_batch_handlers_take_one_slot_per_batch_and_the_limit_counts_their_jobs(
    databases: Callable[[int], list[str]],
) -> None:
    recorder = Recorder()
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip("ab", databases(2), strict=True)}
    async with opened(apps):
        for app in apps.values():
            await app.schedule_many("batched", [{} for _ in range(40)])
        assert await run_cell_workers(apps, options(concurrency=3, stop_when_empty=True)) == 0
        assert [await statuses(app) for app in apps.values()] == [{"completed": 40}] * 2
        assert recorder.peak <= 3
        for app in apps.values():
            await app.schedule_many("batched", [{} for _ in range(40)])
        assert await run_cell_workers(apps, options(concurrency=3, limit=13)) == 0
        assert sum([(await statuses(app))["completed"] for app in apps.values()]) == 80 + 13


async def test_stop_when_empty_ends_when_every_cell_is_empty(databases: Callable[[int], list[str]]) -> None:
    recorder = Recorder()
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip("abc", databases(3), strict=True)}
    async with opened(apps):
        await apps["a"].schedule_many("work", [{"seconds": 0.3} for _ in range(6)])
        await apps["c"].schedule("work", {"seconds": 1.0})  # the last to end, alone in its cell
        code = await run_cell_workers(apps, options(concurrency=2, stop_when_empty=True))
        assert code == 0
        assert [await statuses(app) for app in apps.values()] == [{"completed": 6}, {}, {"completed": 1}]


async def test_the_cells_workers_share_one_worker_id_and_label_their_metrics(
    databases: Callable[[int], list[str]],
) -> None:
    from jobbus.metrics import PrometheusMetrics

    recorder = Recorder()
    apps = {name: cell_app(name, dsn, recorder) for name, dsn in zip("ab", databases(2), strict=True)}
    metrics = PrometheusMetrics(cells=True)
    async with opened(apps):
        for app in apps.values():
            await app.schedule_many("work", [{} for _ in range(3)])
        observers = {cell: [metrics.for_cell(cell)] for cell in apps}
        assert await run_cell_workers(apps, options(stop_when_empty=True, worker_id="w-1"), observers=observers) == 0
        for cell, app in apps.items():
            async with app.pool.connection() as conn:
                rows = await (await conn.execute("SELECT id, state FROM jobbus.worker")).fetchall()
            assert rows == [("w-1", "stopped")], cell
    for cell in apps:
        value = metrics.registry.get_sample_value(
            "jobbus_jobs_finished_total", {"cell": cell, "queue": "default", "type": "work", "outcome": "completed"}
        )
        assert value == 3, cell
    single = PrometheusMetrics()
    assert "cell" not in single.claimed._labelnames
    with pytest.raises(ValueError, match="cells=True"):
        single.for_cell("a")


# -- jobbus worker ----------------------------------------------------------------------------------


def start_cells_worker(cells: dict[str, str], *args: str, dsn: str = "") -> subprocess.Popen[str]:
    import os

    env = {name: value for name, value in os.environ.items() if name != "JOBBUS_DSN"}
    env |= {
        "JOBBUS_TEST_CELLS": ";".join(f"{name}={cell_dsn}" for name, cell_dsn in cells.items()),
        "PYTHONUNBUFFERED": "1",
    }
    if dsn:
        env["JOBBUS_DSN"] = dsn
    return subprocess.Popen(
        [sys.executable, "-m", "jobbus", "worker", "--app", "tests.cell_apps:app", "--poll-interval", "0.2", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def schedule(dsn: str, count: int, seconds: float) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        app.sync.schedule_many("record", [{"seconds": seconds} for _ in range(count)])


def test_sigterm_stops_the_workers_of_both_cells_cleanly(databases: Callable[[int], list[str]]) -> None:
    a, b = databases(2)
    for dsn in (a, b):
        prepare(dsn)
        schedule(dsn, 2, 60.0)  # long, cooperative: they stop when asked
    proc = start_cells_worker({"a": a, "b": b}, "--concurrency", "4", "--shutdown-timeout", "0.5")
    try:
        wait_until(
            lambda: all(len(query(dsn, "SELECT 1 FROM public.executions")) == 2 for dsn in (a, b)),
            what="both cells' jobs running",
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "[cell a]" in out and "[cell b]" in out, out
    for dsn in (a, b):
        # Nothing left running: each job came back at once (released), its lease gone.
        assert query(dsn, "SELECT status, lease_token IS NULL, attempts FROM jobbus.job") == [("queued", True, 0)] * 2
        assert query(dsn, "SELECT state FROM jobbus.worker") == [("stopped",)]


def test_cell_narrows_the_cells_served_and_unknown_cells_are_usage_errors(
    databases: Callable[[int], list[str]],
) -> None:
    a, b = databases(2)
    for dsn in (a, b):
        prepare(dsn)
        schedule(dsn, 3, 0.0)
    proc = start_cells_worker({"a": a, "b": b}, "--cell", "b", "--stop-when-empty")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert query(a, "SELECT count(*) FROM public.executions") == [(0,)]
    assert query(b, "SELECT count(*) FROM public.executions") == [(3,)]

    proc = start_cells_worker({"a": a, "b": b}, "--cell", "b", "--cell", "nope", "--stop-when-empty")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 64, out
    assert "unknown cell nope (the cells are: a, b)" in out

    proc = start_cells_worker({}, "--cell", "a", "--stop-when-empty", dsn=a)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 64, out
    assert "--cell a: the App has no cells" in out
    assert query(a, "SELECT count(*) FROM public.executions") == [(0,)]


def test_a_cells_app_serves_each_job_in_its_cell_and_ticks_a_periodic_job_in_its_queues_cell_alone(
    databases: Callable[[int], list[str]],
) -> None:
    """The real `App(cells=...)` through `jobbus worker`: jobs placed by queue run where they were written,
    and the periodic job declared on the App (queue `reports`, placed in b) is stored and ticks in b only."""
    import os

    a, b = databases(2)
    env = {name: value for name, value in os.environ.items() if name != "JOBBUS_DSN"}
    env |= {"JOBBUS_CELLS": f"a={a};b={b}", "JOBBUS_QUEUE_CELLS": "reports=b", "PYTHONUNBUFFERED": "1"}
    producer = jobbus.App(cells={"a": a, "b": b}, queue_cells={"reports": "b"})
    ids = [producer.sync.schedule("noop") for _ in range(3)] + [
        producer.sync.schedule("report", queue="reports") for _ in range(3)
    ]
    producer.sync.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "worker", "--app", "tests.placed_cells_app:app", "--concurrency", "4"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: (
                len(query(b, "SELECT 1 FROM jobbus.job WHERE name = 'reports.every-second' AND status = 'completed'"))
                >= 2
                and len(query(a, "SELECT 1 FROM jobbus.job WHERE status = 'completed'")) == 3
            ),
            what="the placed jobs done and two ticks of the periodic job",
            timeout=60,
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert query(a, "SELECT id FROM jobbus.job ORDER BY id") == [(job_id,) for job_id in sorted(ids[:3])]
    assert {row[0] for row in query(b, "SELECT id FROM jobbus.job WHERE name IS NULL")} == set(ids[3:])
    assert query(a, "SELECT name FROM jobbus.periodic") == []
    assert query(b, "SELECT name FROM jobbus.periodic") == [("reports.every-second",)]
    assert query(a, "SELECT count(*) FROM jobbus.job WHERE name IS NOT NULL") == [(0,)]
