"""`App`: settings, the registry and the producer/admin API, async and blocking (`app.sync`).

The verbs themselves are written once, in `jobbus.producer._async`; `SyncApp`'s are generated from
them. The decorators (`job`, `task`, `periodic`, `on`) fill the App's `Registry`, which its workers
read. What stays here is each flavour's edges: its pool, its insert path, its listener for `wait`,
migrating, and running a worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack, overload

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from jobbus import schema as schema_module
from jobbus.batching import InsertBatcher
from jobbus.cells import Placement
from jobbus.encryption import keyring_of
from jobbus.errors import CellRequiredError, JobbusError
from jobbus.events import EventHub, JobEvent
from jobbus.models import ClaimedJob, JobSpec
from jobbus.periodic import PeriodicOptions, PeriodicSpec
from jobbus.producer._async import AsyncProducer
from jobbus.producer._sync import SyncProducer
from jobbus.producer.plan import Found
from jobbus.registry import CellRouter, Handler, HandlerOptions, JobScope, Registry
from jobbus.requests import JobDefaults, JobRequest, check_options
from jobbus.resilience import open_pool, open_pool_sync
from jobbus.settings import Settings
from jobbus.store import JobStore
from jobbus.store.audit import AuditStore
from jobbus.store.periodic import PeriodicStore
from jobbus.store.queues import QueueStore
from jobbus.store.statements import channel_name, configure_async, configure_connection
from jobbus.tasks import Task
from jobbus.waiting import FinishedJobs, SyncFinishedJobs
from jobbus.worker.options import WorkerOptions
from jobbus.worker.runtime import EXIT_OK, Worker

if TYPE_CHECKING:
    from jobbus.store.maintenance import QueueSample

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")
#: Insert statements one App has in flight at once; concurrent `schedule` calls beyond share them.
BATCHES_IN_FLIGHT = 4
#: At most this many jobs of concurrent callers go in one shared statement.
BATCH_JOBS = 500


class App(AsyncProducer):
    """The entry point: holds settings, handlers, listeners and the connection pool.

    ``async with app:`` opens the pool; ``app.sync`` offers the same producer and admin methods as
    blocking calls for Django, Flask and scripts.
    """

    def __init__(
        self, *, job_scope: JobScope | None = None, cell_router: CellRouter | None = None, **settings: Any
    ) -> None:
        #: Handlers, periodic jobs, listeners and the job scope: what this App's workers run.
        self.registry = Registry(Settings.load(settings), job_scope)
        self.store = JobStore(self.settings.schema)
        self.periodic_store = PeriodicStore(self.settings.schema, self.store.channel)
        self.queue_store = QueueStore(self.settings.schema)
        self.audit_store = AuditStore(self.settings.schema)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._pool_users = 0
        self._batcher: InsertBatcher | None = None
        self._finished: FinishedJobs | None = None
        self._app = self  # the verbs read the settings and the registry of the App that runs them
        self._cells: dict[str, App] = {}
        self.sync = SyncApp(self)
        self._build_cells()
        if cell_router is not None:
            self.cell_router = cell_router

    def _build_cells(self) -> None:
        """With cells (SPEC 23): one ordinary App per cell, in cell order, over this App's registry."""
        settings = self.settings
        self.registry.placement = Placement.of(settings.cells, settings.queue_cells) if settings.cells else None
        self.registry.cell_registries.clear()
        self._cells = {}
        for name, dsn in (settings.cells or {}).items():
            # Every setting given as a keyword: the environment's JOBBUS_CELLS or JOBBUS_DSN plays no part.
            cell = App(**dataclasses.replace(settings, dsn=dsn, cells=None, queue_cells=None).as_dict())
            cell.registry = self.registry.for_cell(name, cell.settings)
            self._cells[name] = cell

    @property
    def cell_router(self) -> CellRouter | None:
        """With cells: `router(job_type, configuration)` names the cell of each job given no `cell=` (a
        database per tenant), or returns None to leave it to `queue_cells` and the first cell. Not asked
        for follow-ups, children and group callbacks: they stay in their parent's cell."""
        return self.registry.cell_router

    @cell_router.setter
    def cell_router(self, router: CellRouter | None) -> None:
        if router is not None and not callable(router):
            raise ValueError(f"cell_router must be a callable (job_type, configuration) -> cell name, got {router!r}")
        if router is not None and not self._cells:
            raise ValueError("cell_router places jobs among cells: it needs cells (App(cells=...) or JOBBUS_CELLS)")
        self.registry.cell_router = router

    @property
    def cells(self) -> Mapping[str, App]:
        """With `cells=` (SPEC 23): one single-database App per cell, in cell order, sharing this App's
        handlers, tasks, periodic declarations, listeners and job scope; empty for an App without cells.
        Opening and closing this App opens and closes theirs (a cell that is down does not stop it)."""
        return MappingProxyType(self._cells)

    def reconfigure(self, **changes: Any) -> Settings:
        """Change some settings of this App while it is closed; returns the settings it had before.

        For tests that point a project's own App at an isolated database or schema (`jobbus.testing`
        does): ``previous = app.reconfigure(schema="test_1")`` ... ``app.reconfigure(**previous.as_dict())``.
        Handlers, tasks, periodic jobs and listeners stay; the blocking pool is closed and reopens on
        the new settings. Values are validated as in `App(...)`.
        """
        if self._pool is not None or self._pool_users:
            raise RuntimeError("reconfigure() needs a closed App: leave its `async with app:` first")
        unknown = sorted(set(changes) - set(Settings.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        previous = self.settings
        settings = dataclasses.replace(previous, **changes)
        keyring_of(settings.encryption_keys)  # bad keys or a missing cryptography package fail here
        self.sync.close()
        self.settings = settings
        self.store = JobStore(settings.schema)
        self.periodic_store = PeriodicStore(settings.schema, self.store.channel)
        self.queue_store = QueueStore(settings.schema)
        self.audit_store = AuditStore(settings.schema)
        self._build_cells()
        return previous

    # -- registry ----------------------------------------------------------------------------------

    def job(self, type: str, **options: Unpack[HandlerOptions]) -> Callable[[F], F]:
        """Register a handler: ``async def`` receives a `JobExecution`, ``def`` a `SyncJobExecution`.

        The options are those of `HandlerOptions`: the jobs' default `queue`, `max_attempts` and
        `priority`; `timeout` (seconds or a timedelta) bounds every attempt of its jobs (a job's own
        `timeout` wins); `backoff(attempt, error)` returns the delay before the next attempt (seconds
        or a timedelta) and replaces the settings' formula for this type. With `batch_size=N` the
        handler is a batch handler: it gets a `JobBatch` of up to N jobs of its type claimed together
        (waiting up to `batch_wait` for more once the first is claimed), see docs/batches.md.
        """
        return self.registry.job(type, **options)

    @overload
    def task(self, name: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, name: str | None = None, **options: Unpack[HandlerOptions]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(self, name: str | Callable[..., Any] | None = None, **options: Unpack[HandlerOptions]) -> Any:
        """Register a function as a typed task: its parameters are the job's input (see `jobbus.Task`).

        ``@app.task`` or ``@app.task("mail.send", queue="mail", ...)``; the job type defaults to the
        function's ``module.qualname``. The options are those of `job`. Sync functions run in a worker
        thread, async ones in the event loop; `jobbus.current_job()` gives the running job inside.
        """
        check_options("app.task()", options, HandlerOptions.__optional_keys__)

        def register(func: Callable[P, R]) -> Task[P, R]:
            return self.registry.task(self, func, name if isinstance(name, str) else None, **options)

        if callable(name):
            return register(name)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"@app.task(name): the job type must be a string, got {name!r}")
        return register

    def periodic(self, name: str, *, type: str, **options: Unpack[PeriodicOptions]) -> None:
        """Declare a periodic job in code: exactly one of `cron` (5 fields, in `timezone`) or `every`
        (the options are those of `PeriodicOptions`).

        Workers store it when they start (and delete code-declared ones their code no longer has, for
        the job types they handle); the leader enqueues one job per tick, fleet-wide.
        """
        self.registry.periodic(name, type=type, **options)

    def on(self, event_type: type[JobEvent]) -> Callable[[F], F]:
        """Register a sync or async listener for a lifecycle event class (and its subclasses)."""
        return self.registry.events.on(event_type)  # type: ignore[return-value]

    @property
    def settings(self) -> Settings:
        """This App's settings (the registry's, which its job defaults and payload limit come from)."""
        return self.registry.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self.registry.settings = settings

    @property
    def handlers(self) -> dict[str, Handler]:
        """The registered handlers by job type."""
        return self.registry.handlers

    @property
    def periodics(self) -> dict[str, PeriodicSpec]:
        """The periodic jobs declared in code (`periodic`) by name."""
        return self.registry.periodics

    @property
    def events(self) -> EventHub:
        """The lifecycle events' listeners (`on`)."""
        return self.registry.events

    @property
    def job_scope(self) -> JobScope | None:
        """`App(job_scope=...)`: job → the async context manager a worker enters around each job."""
        return self.registry.job_scope

    @job_scope.setter
    def job_scope(self, job_scope: JobScope | None) -> None:
        self.registry.job_scope = job_scope
        for cell in self._cells.values():
            cell.job_scope = job_scope

    def job_defaults(self, job_type: str) -> JobDefaults:
        return self.registry.job_defaults(job_type)

    def max_attempts_of(self, job_type: str) -> int:
        return self.registry.max_attempts_of(job_type)

    def build_job_spec(self, request: JobRequest, depth: int = 0) -> JobSpec:
        """Validate a request and its chain of follow-ups (each gets its id now, so it is written once)."""
        return self.registry.build_job_spec(request, depth)

    # -- connections -------------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        if self._cells:
            raise CellRequiredError(self._no_database_of_its_own())
        if not self.settings.dsn:
            raise ValueError("dsn: no database given; pass App(dsn=...) or set JOBBUS_DSN")
        return self.settings.dsn

    async def open(self, *, timeout: float | None = None) -> None:
        """Open the connection pool (idempotent, reference-counted with `close`).

        Waits at most `timeout` seconds (default `database_wait_seconds`) for the database, then raises
        `DatabaseUnavailableError` naming why it could not connect; nothing stays open then. With cells,
        each cell's pool opens without waiting: a cell that is down is connected to when it is back.
        """
        if self._cells:
            self._pool_users += 1
            if self._pool_users == 1:
                for cell in self._cells.values():
                    await cell._open(None, wait=False)
            return
        await self._open(timeout, wait=True)

    async def _open(self, timeout: float | None, *, wait: bool) -> None:
        self._pool_users += 1
        if self._pool is None:
            pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self.settings.pool_max_size,
                kwargs=self.settings.connection_kwargs,
                configure=configure_async,
                open=False,
                name=f"jobbus-{self.settings.schema}" + (f"-{self.registry.cell}" if self.registry.cell else ""),
            )
            try:
                if wait:
                    await open_pool(pool, self.dsn, self.settings.database_wait_seconds if timeout is None else timeout)
                else:
                    await pool.open(wait=False)
            except BaseException:
                self._pool_users -= 1
                await pool.close()
                raise
            self._pool = pool
            self._batcher = InsertBatcher(
                self._insert_now, in_flight=min(BATCHES_IN_FLIGHT, self.settings.pool_max_size), max_jobs=BATCH_JOBS
            )

    async def close(self) -> None:
        if self._cells:
            if self._pool_users == 1:
                for cell in self._cells.values():
                    await cell.close()
            self._pool_users = max(0, self._pool_users - 1)
            return
        self._pool_users = max(0, self._pool_users - 1)
        if self._pool_users == 0 and self._pool is not None:
            pool, self._pool, self._batcher = self._pool, None, None
            finished, self._finished = self._finished, None
            if finished is not None:
                await finished.close()
            await pool.close()

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            if self._cells:
                raise CellRequiredError(self._no_database_of_its_own())
            raise RuntimeError("the App is not open: use `async with app:` (or app.sync for blocking code)")
        return self._pool

    def _no_database_of_its_own(self) -> str:
        return (
            f"this App spreads over cells ({', '.join(self._cells)}) and has no database of its own: call "
            "this on the App of one cell, app.cells[NAME] (see docs/cells.md for what acts on every cell)"
        )

    # -- the async edges of the producer verbs (`jobbus.producer._async`) --------------------------

    def _in_cell(self, cell: str) -> App:
        return self._cells[cell]

    _WRONG_CONNECTION = "connection= must be a psycopg.AsyncConnection here (use app.sync with a sync one)"

    def _connection(self, timeout: float) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        return self.pool.connection(timeout=timeout)

    async def _insert(self, specs: Sequence[JobSpec], connection: psycopg.AsyncConnection[Any] | None) -> Found:
        """In the caller's transaction, or on the pool in a statement shared with concurrent callers."""
        if connection is not None:
            return await self._run(self.store.insert_jobs(specs), connection)
        if self._batcher is None:
            self.pool  # noqa: B018 - raises: the App is not open
            raise AssertionError("an open App has a batcher")
        return dict(await self._batcher.insert(specs))

    async def _insert_now(self, specs: Sequence[JobSpec]) -> Found:
        return await self._run(self.store.insert_jobs(specs))

    def _finished_jobs(self) -> FinishedJobs:
        self.pool  # noqa: B018 - raises: the App is not open
        if self._finished is None:
            settings = self.settings
            self._finished = FinishedJobs(
                settings.notification_dsn, channel_name(settings.schema, "_done"), settings.connection_kwargs
            )
        return self._finished

    async def _migrate(self) -> list[schema_module.Migration]:
        return await asyncio.to_thread(self.sync.migrate)

    # -- worker ------------------------------------------------------------------------------------

    async def run_worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> int:
        """Run a worker in this event loop until it stops; returns its exit code (0, 70 or 75).

        A shortcut for ``await jobbus.Worker(app, ...).run()``; keep the `Worker` to stop it from outside.
        With cells, one worker serves every cell (`jobbus.worker.cells`).
        """
        if self._cells:
            from jobbus.worker.cells import run_cell_workers  # the cells' runtime, imported only with cells

            if options is not None and kwargs:
                raise TypeError("pass either WorkerOptions or keyword options, not both")
            code: int = await run_cell_workers(self.cells, options if options is not None else WorkerOptions(**kwargs))
            return code
        return await Worker(self, options, **kwargs).run()

    async def drain(
        self,
        *,
        queues: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        max_jobs: int | None = None,
        concurrency: int = 1,
    ) -> dict[str, int]:
        """Run every available job in this process until none is left; returns counts per outcome.

        For tests and scripts: a worker runs in this event loop (one job at a time unless
        `concurrency` says otherwise), claiming from `queues` and `types` (default: all this App
        handles), at most `max_jobs` jobs, and stops when no job is available. A job retried without
        delay runs again in the same drain; one retried later, or scheduled for later, is left.
        The counts are those of the attempts, by outcome: ``{"completed": 2, "retried": 1}``
        (also ``failed``, ``cancelled``, ``snoozed``, ``timed_out``, ``released``, ``lost``).
        With cells, each cell is drained in turn, in cell order, and the counts are added up.
        """
        if not self.registry.handlers:
            return {}
        if self._cells:
            total: dict[str, int] = {}
            for cell in self._cells.values():
                drained = await cell.drain(queues=queues, types=types, max_jobs=max_jobs, concurrency=concurrency)
                for outcome, count in drained.items():
                    total[outcome] = total.get(outcome, 0) + count
            return total
        counts = _OutcomeCounts()
        options = WorkerOptions(
            queues=queues, types=types, limit=max_jobs, concurrency=concurrency, stop_when_empty=True
        )
        code = await Worker(self, options, observers=[counts]).run()
        if code != EXIT_OK:
            raise JobbusError(f"drain: the worker stopped with exit code {code} before every job had run")
        return dict(counts.outcomes)


class SyncApp(SyncProducer):
    """The blocking twin of `App`'s producer and admin methods, over its own sync pool.

    Same statements, same validation, same results; ``connection=`` takes a sync psycopg connection.
    """

    _WRONG_CONNECTION = "connection= must be a sync psycopg.Connection here (use await app.schedule otherwise)"

    def __init__(self, app: App) -> None:
        self._app: App = app
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._lock = threading.Lock()
        self._finished: SyncFinishedJobs | None = None

    def _pool_or_open(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._lock:
            if self._pool is None:
                settings = self._app.settings
                pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                    self._app.dsn,
                    min_size=1,
                    max_size=settings.pool_max_size,
                    kwargs=settings.connection_kwargs,
                    configure=configure_connection,
                    open=False,
                    name=f"jobbus-sync-{settings.schema}",
                )
                open_pool_sync(pool, self._app.dsn, settings.database_wait_seconds)
                self._pool = pool
            return self._pool

    def close(self) -> None:
        for cell in self._app._cells.values():
            cell.sync.close()
        with self._lock:
            pool, self._pool = self._pool, None
            finished, self._finished = self._finished, None
        if finished is not None:
            finished.close()
        if pool is not None:
            pool.close()

    def __enter__(self) -> SyncApp:
        if not self._app._cells:  # with cells, each cell's pool opens at its first call
            self._pool_or_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the blocking edges of the producer verbs (`jobbus.producer._sync`) ------------------------

    def _connection(self, timeout: float) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self._pool_or_open().connection(timeout=timeout)

    def _in_cell(self, cell: str) -> SyncApp:
        return self._app._cells[cell].sync

    def _insert(self, specs: Sequence[JobSpec], connection: psycopg.Connection[Any] | None) -> Found:
        return self._run(self._app.store.insert_jobs(specs), connection)

    def _finished_jobs(self) -> SyncFinishedJobs:
        self._pool_or_open()
        settings = self._app.settings
        with self._lock:
            if self._finished is None:
                self._finished = SyncFinishedJobs(
                    settings.notification_dsn, channel_name(settings.schema, "_done"), settings.connection_kwargs
                )
            return self._finished

    def _migrate(self) -> list[schema_module.Migration]:
        with psycopg.connect(self._app.dsn, **self._app.settings.connection_kwargs) as conn:
            return schema_module.migrate(conn, self._app.settings.schema)

    def drain(
        self,
        *,
        queues: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        max_jobs: int | None = None,
        concurrency: int = 1,
    ) -> dict[str, int]:
        """`App.drain` for blocking code: runs it in an event loop of its own, on a thread of its own."""
        if self._app._pool is not None:
            raise RuntimeError("app.sync.drain() runs its own event loop: where the App is open, use await app.drain()")
        drained: list[dict[str, int]] = []

        def run() -> None:
            drained.append(
                asyncio.run(self._app.drain(queues=queues, types=types, max_jobs=max_jobs, concurrency=concurrency))
            )

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobbus-drain") as thread:
            thread.submit(run).result()
        return drained[0]


class _OutcomeCounts:
    """A worker observer counting attempts by outcome, for `drain`."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}

    def job_claimed(self, job: ClaimedJob, waited_seconds: float) -> None:
        pass

    def job_finished(self, job: ClaimedJob, outcome: str, seconds: float) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def queues_sampled(self, samples: Sequence[QueueSample]) -> None:
        pass

    def leadership_changed(self, is_leader: bool) -> None:
        pass
