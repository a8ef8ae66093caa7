"""One worker process serving several cells (SPEC 23) within one concurrency budget.

Each cell gets an ordinary `Worker` of its own (pools, listener, registry row, leader election and
maintenance in its own database), all in this event loop; their claim loops share a `CellBudget`, so
the handlers running in all cells never exceed `concurrency`, and a busy cell does not starve another.
A cell whose database is down backs off alone: its worker starts once it can connect, the others
serve meanwhile. Signals, `stop_when_empty`, `run_once`, `limit` and the health endpoints are the
process's: every cell's worker stops, `stop_when_empty` ends when every cell is empty, `limit` counts
the jobs of all cells. A worker of one database runs none of this.

    code = await run_cell_workers(app.cells, WorkerOptions(concurrency=20))
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import psycopg

from jobbus.encryption import EncryptionUnavailableError
from jobbus.errors import DatabaseUnavailableError, SchemaError, TransactionPoolerError
from jobbus.models import ClaimedJob, JobStatus
from jobbus.resilience import Backoff, first_line, is_transient
from jobbus.settings import redact
from jobbus.store import Statement
from jobbus.worker.app_view import AppView
from jobbus.worker.attempt import Attempt
from jobbus.worker.batches import BatchCall
from jobbus.worker.budget import CellBudget
from jobbus.worker.claimer import Claimer
from jobbus.worker.health import HealthReport, HealthServer
from jobbus.worker.observer import WorkerObserver
from jobbus.worker.options import WorkerOptions
from jobbus.worker.producer import Producer
from jobbus.worker.registration import WorkerIdInUseError
from jobbus.worker.runtime import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_RESTART,
    EXIT_SOFTWARE,
    Worker,
    install_stop_signals,
    remove_signals,
)

logger = logging.getLogger("jobbus.worker")
T = TypeVar("T")

#: A cell's database is probed this long at most before its worker starts (a refused connection fails at once).
PROBE_SECONDS = 3
#: How often the process's own event loop tick is taken, for `/livez` while no cell's worker runs.
TICK_SECONDS = 0.1
#: A cell's claim waits this long at most for a connection of its worker's pool (then the claim loop's
#: backoff): the slots it reserved are the other cells' again at once.
CLAIM_CONNECTION_WAIT_SECONDS = 0.5
#: Errors a cell's worker meets at its start that no retry mends: the process stops, exit 78.
CONFIGURATION_ERRORS = (SchemaError, WorkerIdInUseError, TransactionPoolerError, EncryptionUnavailableError)


def select_cells(apps: Mapping[str, AppView], cells: Sequence[str] | None) -> list[str]:
    """The cells to serve: `cells` (each once, in the order given), or every cell of `apps`; a name that
    is not a cell raises `ValueError` naming it and the cells there are."""
    if not apps:
        raise ValueError("no cells to serve: the App has none (give App(cells=...) or JOBBUS_CELLS)")
    if cells is None:
        return list(apps)
    unknown = [name for name in cells if name not in apps]
    if unknown:
        raise ValueError(f"unknown cell {', '.join(unknown)} (the cells are: {', '.join(apps)})")
    return list(dict.fromkeys(cells))


async def run_cell_workers(
    apps: Mapping[str, AppView],
    options: WorkerOptions,
    *,
    observers: Mapping[str, Sequence[WorkerObserver]] | None = None,
) -> int:
    """Serve the cells `options.cells` (None: every cell of `apps`, the App of each cell by name) in
    this event loop until stopped, within `options.concurrency` in all; returns the exit code: 0, or
    the code of a cell's worker that stopped the process (75 restart, 70 fatal error, 78 configuration).
    `observers`: each cell's worker observers (`PrometheusMetrics(cells=True).for_cell(name)`)."""
    return await CellWorkers(apps, options, observers=observers).run()


class CellWorkers:
    """The workers of the cells one process serves, and what they share: the budget, the worker id,
    the signals and the health endpoints. `run()` returns the process's exit code."""

    def __init__(
        self,
        apps: Mapping[str, AppView],
        options: WorkerOptions,
        *,
        observers: Mapping[str, Sequence[WorkerObserver]] | None = None,
    ) -> None:
        self.cells = select_cells(apps, options.cells)
        self.apps = {cell: apps[cell] for cell in self.cells}
        self.options = options
        #: One id for the process in every cell's worker registry: `jobbus workers` shows it in each.
        self.worker_id = options.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.budget = CellBudget(self.cells, options.concurrency, options.job_limit)
        self._cell_options = dataclasses.replace(
            options, cells=None, worker_id=self.worker_id, install_signal_handlers=False, health_port=None
        )
        self._observers = observers or {}
        #: The worker of each cell that has one now (none while its database is down).
        self.workers: dict[str, CellWorker] = {}
        #: Jobs still running in threads after their worker stopped (the process must end them).
        self.abandoned = 0
        self._down: set[str] = set()
        self._ended: set[str] = set()
        self._stopping = False
        self._finished = False
        self._exit_code = EXIT_OK
        self._stop: asyncio.Event | None = None
        self._last_tick = time.monotonic()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._signals_received = 0

    def request_stop(self, exit_code: int = EXIT_OK) -> None:
        """Stop every cell's worker (the shutdown sequence of each); a cell still down is not waited for."""
        self._exit_code = _worse(self._exit_code, exit_code)
        self._stopping = True
        if self._stop is not None:
            self._stop.set()
        for worker in list(self.workers.values()):
            worker.request_stop(exit_code)

    async def run(self) -> int:
        """Serve until every cell's worker has stopped; returns the exit code."""
        first = {cell: self._new_worker(cell) for cell in self.cells}  # bad options fail here, before any start
        heartbeat = min(app.settings.heartbeat_seconds for app in self.apps.values())
        health = HealthServer.asked_for(self._health_report, self.options, heartbeat)
        self._stop = asyncio.Event()
        if self._stopping:
            self._stop.set()
        self._tick()
        installed = install_stop_signals(self.options.install_signal_handlers, self._on_signal)
        if health is not None:
            health.start()
        try:
            with cell_logging():
                tasks = {
                    asyncio.create_task(self._serve_cell(cell, first[cell]), name=f"jobbus-cell-{cell}"): cell
                    for cell in self.cells
                }
                pending: set[asyncio.Task[int]] = set(tasks)
                try:
                    while pending:
                        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                        for task in done:
                            self._ended.add(tasks[task])
                            self._cell_ended(tasks[task], task.result())
                except BaseException:
                    # A bug, or the task running the process cancelled: no cell's worker is left behind.
                    self.request_stop(EXIT_SOFTWARE)
                    await asyncio.gather(*pending, return_exceptions=True)
                    raise
                return self._exit_code
        finally:
            self._finished = True
            if self._tick_handle is not None:
                self._tick_handle.cancel()
            remove_signals(installed)
            if health is not None:
                health.close()

    def _cell_ended(self, cell: str, code: int) -> None:
        """A cell's worker ended: with a code other than 0, every other cell's worker stops too."""
        if code != EXIT_OK and not self._stopping:
            logger.warning(
                "cell %s: its worker exited %d: stopping the workers of every cell",
                cell,
                code,
                extra={"cell": cell, "worker_id": self.worker_id},
            )
            self.request_stop()
        self._exit_code = _worse(self._exit_code, code)

    # -- one cell -----------------------------------------------------------------------------------

    def _new_worker(self, cell: str) -> CellWorker:
        return CellWorker(
            self.apps[cell],
            self._cell_options,
            budget=self.budget,
            cell=cell,
            observers=self._observers.get(cell, ()),
        )

    async def _serve_cell(self, cell: str, worker: CellWorker | None) -> int:
        """Run the cell's worker once its database can be reached; until then, and whenever it cannot be
        reached at a start, back off alone. Returns the exit code of its worker."""
        _current_cell.set(cell)  # this task's context: every record its worker logs carries the cell
        app = self.apps[cell]
        backoff = Backoff()
        down_since: float | None = None
        while not self._stopping and not self.budget.limit_reached:
            try:
                problem = await _unreachable(app.dsn)
            except psycopg.ProgrammingError as exc:  # libpq refused the connection string itself
                logger.error(
                    "cell %s: its database DSN is not valid (%s): stopping, exit %d",
                    cell,
                    redact(first_line(exc)),
                    EXIT_CONFIG,
                    extra={"cell": cell},
                )
                return EXIT_CONFIG
            if self._stopping:
                break
            if problem is None:
                if down_since is not None:
                    logger.warning(
                        "the database of cell %s can be reached again after %.1f s: starting its worker",
                        cell,
                        time.monotonic() - down_since,
                        extra={"cell": cell},
                    )
                    down_since = None
                    self._down.discard(cell)
                worker = worker or self._new_worker(cell)
                self.workers[cell] = worker
                try:
                    code = await worker.run()
                except Exception as exc:
                    if not (isinstance(exc, DatabaseUnavailableError) or is_transient(exc)):
                        return self._failed_at_start(cell, exc)
                    problem = exc
                else:
                    self.abandoned += worker.abandoned
                    return code
                finally:
                    self.workers.pop(cell, None)
                    self.budget.leave(cell)
                    worker = None
            if down_since is None:
                down_since = time.monotonic()
                self._down.add(cell)
                logger.warning(
                    "the database of cell %s cannot be reached (%s: %s); its worker starts once it can, "
                    "the other cells are served meanwhile",
                    cell,
                    type(problem).__name__,
                    redact(first_line(problem)),
                    extra={"cell": cell},
                )
            await self._pause(backoff.next_delay())
        return EXIT_OK

    def _failed_at_start(self, cell: str, exc: Exception) -> int:
        if isinstance(exc, CONFIGURATION_ERRORS):
            logger.error("cell %s: %s: stopping, exit %d", cell, exc, EXIT_CONFIG, extra={"cell": cell})
            return EXIT_CONFIG
        logger.error(
            "cell %s: its worker failed to start (%s: %s): stopping, exit %d",
            cell,
            type(exc).__name__,
            first_line(exc),
            EXIT_SOFTWARE,
            exc_info=exc,
            extra={"cell": cell},
        )
        return EXIT_SOFTWARE

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or until the process is asked to stop."""
        assert self._stop is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # -- the process's signals and health -----------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        """The first signal stops every cell's worker gracefully; the second skips every remaining wait."""
        self._signals_received += 1
        if self._signals_received == 1:
            logger.info("%s: stopping the workers of %d cell(s)", sig.name, len(self.cells))
        for cell, worker in list(self.workers.items()):
            token = _current_cell.set(cell)
            try:
                worker._on_signal(sig)
            finally:
                _current_cell.reset(token)
        self.request_stop()

    def _tick(self) -> None:
        self._last_tick = time.monotonic()
        if not self._finished:
            self._tick_handle = asyncio.get_running_loop().call_later(TICK_SECONDS, self._tick)

    def _health_report(self) -> HealthReport:
        """The process's health, read from the health thread: live while the event loop ticks, ready while
        the worker of at least one cell is registered and in touch with its database."""
        now = time.monotonic()
        workers = dict(self.workers)
        cells: dict[str, str] = {}
        reports = []
        for cell in self.cells:
            worker = workers.get(cell)
            if worker is not None:
                report = worker._health_report()
                reports.append(report)
                cells[cell] = report.state
            elif cell in self._ended:
                cells[cell] = "stopped"
            else:
                cells[cell] = "unreachable" if cell in self._down else "starting"
        registered = [report for report in reports if report.registered]
        silences = [r.database_silent_seconds for r in registered if r.database_silent_seconds is not None]
        if self._finished:
            state = "stopped"
        elif self._stopping:
            state = "stopping"
        elif registered:
            states = [report.state for report in registered]
            state = "running" if "running" in states else states[0]
        else:
            state = "starting"
        return HealthReport(
            worker_id=self.worker_id,
            state=state,
            in_flight=sum(report.in_flight for report in reports),
            loop_silent_seconds=max(0.0, now - self._last_tick),
            database_silent_seconds=min(silences) if silences else None,
            registered=bool(registered),
            cells=cells,
        )


class CellWorker(Worker):
    """The worker of one cell of several: an ordinary `Worker` whose claims take their slots from the
    process's `CellBudget`."""

    def __init__(
        self,
        app: AppView,
        options: WorkerOptions,
        *,
        budget: CellBudget,
        cell: str,
        observers: Sequence[WorkerObserver] = (),
    ) -> None:
        self.budget = budget
        self.cell = cell
        super().__init__(app, options, observers=observers)

    def _new_claimer(self, **parts: Any) -> Claimer:
        return CellClaimer(budget=self.budget, cell=self.cell, **{**parts, "run": self._run_claim})

    async def _run_claim(self, statement: Statement[T]) -> T:
        """The claimer's statements wait for a connection `CLAIM_CONNECTION_WAIT_SECONDS` at most: a claim's
        slots are reserved in the budget while it waits, and a cell whose database is away must not hold
        them from the other cells for the pool's usual 30 s."""
        return await self.pools.run_waiting(statement, CLAIM_CONNECTION_WAIT_SECONDS)

    def _new_producer(self, app: AppView, options: WorkerOptions, **parts: Any) -> Producer:
        return CellProducer(app, options, budget=self.budget, cell=self.cell, **parts)


class CellClaimer(Claimer):
    """Each claim statement reserves its slots (and, with a limit, its jobs) in the budget while it is in
    flight; the claimed jobs take their slots in the claim loop before anything else runs."""

    def __init__(self, *, budget: CellBudget, cell: str, **parts: Any) -> None:
        super().__init__(**parts)
        self.budget = budget
        self.cell = cell
        self._jobs_per_slot = max(self._batch_sizes.values(), default=1)

    async def claim(
        self, free: int, paused_queues: frozenset[str], *, jobs_left: int | None = None
    ) -> tuple[list[ClaimedJob], float]:
        slots, jobs = self.budget.reserve(self.cell, free, jobs_left, jobs_per_slot=self._jobs_per_slot)
        if slots <= 0:
            self.expired_ahead = self.backlog = self.limited_short = False
            return [], time.monotonic()
        try:
            claimed = await super().claim(slots, paused_queues, jobs_left=jobs)
        except BaseException:
            self.budget.settle(self.cell, slots, jobs, full=False, failed=True)
            raise
        self.budget.settle(self.cell, slots, jobs, full=self.backlog)
        return claimed

    async def claim_batch(
        self, job_type: str, limit: int, paused_queues: frozenset[str]
    ) -> tuple[list[ClaimedJob], float]:
        jobs = self.budget.reserve_jobs(limit)
        if jobs <= 0:
            return [], time.monotonic()
        try:
            return await super().claim_batch(job_type, jobs, paused_queues)
        finally:
            self.budget.settle_jobs(jobs)


class CellProducer(Producer):
    """The claim loop of one cell: its free slots are what the budget grants, a slot it frees wakes the
    cells waiting for one, and `limit` counts the jobs claimed in every cell."""

    def __init__(self, app: AppView, options: WorkerOptions, *, budget: CellBudget, cell: str, **parts: Any) -> None:
        self.budget = budget
        self.cell = cell
        self._drain_asked = False
        self._counting = False
        super().__init__(app, options, **parts)
        self._counting = True

    @property
    def _claimed_total(self) -> int:
        """The jobs claimed in every cell: `limit` and `run_once` are the process's."""
        return self.budget.claimed

    @_claimed_total.setter
    def _claimed_total(self, value: int) -> None:
        if self._counting:  # the claim loop's own start at 0 is not a count
            self.budget.count(value - self.budget.claimed)

    @property
    def draining(self) -> bool:
        """A cell waiting for slots that other cells hold has not found its queues empty: it drains on."""
        return self._drain_asked and not self.budget.waiting(self.cell)

    @draining.setter
    def draining(self, value: bool) -> None:
        self._drain_asked = value

    async def run(self) -> None:
        self.budget.join(self.cell, running=self._running_now, wake=self._wake.set)
        await super().run()

    def stop(self) -> None:
        super().stop()
        self.budget.idle(self.cell)  # it claims no more: nothing is kept for it while its jobs end

    def _running_now(self) -> int:
        return self._running

    def _free_slots(self) -> int:
        free = super()._free_slots()
        if self.control.paused or self.monitor.fenced:
            self.budget.idle(self.cell)  # claims nothing now: nothing is kept for it
            return free
        if free <= 0:
            return 0
        return self.budget.request(self.cell, free)

    def _slot_freed(self, attempt: Attempt) -> None:
        super()._slot_freed(attempt)
        self.budget.released()

    def _batch_slot_freed(self, batch: BatchCall) -> None:
        super()._batch_slot_freed(batch)
        self.budget.released()

    def _finished(self, attempt: Attempt, status: JobStatus | None, kind: str) -> None:
        super()._finished(attempt, status, kind)
        self.budget.released()


# -- logs ---------------------------------------------------------------------------------------------

#: The cell whose worker runs in the current context (each cell's worker runs in a task of its own).
_current_cell: contextvars.ContextVar[str | None] = contextvars.ContextVar("jobbus_cell", default=None)


class CellField(logging.Filter):
    """Gives the worker's records the `cell` of the worker that logs them (structured, as `extra=`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        cell = _current_cell.get()
        if cell is not None and not hasattr(record, "cell"):
            record.cell = cell
        return True


_CELL_FIELD = CellField()
_installed = threading.Lock()
_users = 0


@contextlib.contextmanager
def cell_logging() -> Iterator[None]:
    """While a process serves cells, the worker's records carry their cell (on the `jobbus.worker` logger,
    once however many processes of cells run in this interpreter; taken off when the last one stops)."""
    global _users
    with _installed:
        if _users == 0:
            logger.addFilter(_CELL_FIELD)
        _users += 1
    try:
        yield
    finally:
        with _installed:
            _users -= 1
            if _users == 0:
                logger.removeFilter(_CELL_FIELD)


# -- helpers ------------------------------------------------------------------------------------------


async def _unreachable(dsn: str) -> Exception | None:
    """Why the database of `dsn` cannot be connected to now, or None when it can."""
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=PROBE_SECONDS)
    except psycopg.OperationalError as exc:
        return exc
    await conn.close()
    return None


#: How bad an exit code is, for the process's: a fatal error or a configuration error, then a restart.
_SEVERITY = {EXIT_OK: 0, EXIT_RESTART: 1, EXIT_SOFTWARE: 2, EXIT_CONFIG: 2}


def _worse(current: int, new: int) -> int:
    """The process's exit code: the first of the most severe codes its cells' workers exited with."""
    return new if _SEVERITY.get(new, 2) > _SEVERITY.get(current, 2) else current


__all__ = ["CellBudget", "CellWorkers", "run_cell_workers", "select_cells"]
