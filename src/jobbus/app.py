"""`App`: settings, the handler registry and the producer/admin API, async and blocking (`app.sync`)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from jobbus import schema as schema_module
from jobbus import tracing
from jobbus.batching import InsertBatcher
from jobbus.durations import resolve_available_at, seconds_or_none
from jobbus.errors import DatabaseUnavailableError, InvalidJobError, InvalidStateError, JobbusError
from jobbus.events import EventHub, JobCancelled, JobEvent, JobScheduled
from jobbus.execution import check_event_key
from jobbus.limits import KEEP, Keep, QueueSettings, RateLimit, check_count, check_rate
from jobbus.models import JOB_VIEWS, ClaimedJob, GroupProgress, Job, JobSpec, JobStatus
from jobbus.periodic import Periodic, PeriodicSpec
from jobbus.requests import (
    MAX_TYPE_BYTES,
    JobDefaults,
    JobRequest,
    build_spec,
    json_text,
    new_job_id,
    spec_json,
    specs_sharing,
    validate_text,
)
from jobbus.resilience import Backoff, first_line, is_transient, open_pool, open_pool_sync
from jobbus.settings import Settings
from jobbus.store import CancelResult, JobStore, Statement, run_async, run_sync
from jobbus.store.jobs import GROUP_REFUSED
from jobbus.store.periodic import PeriodicStore
from jobbus.store.queues import QueueStore
from jobbus.store.statements import Operation, channel_name, configure_async, configure_connection
from jobbus.waiting import FinishedJobs, SyncFinishedJobs, timeout_message, vanished_message

if TYPE_CHECKING:
    from jobbus.store.maintenance import QueueSample
    from jobbus.tasks import Task
    from jobbus.worker.options import WorkerOptions

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
JobScope = Callable[[Any], AbstractAsyncContextManager[Any]]
#: A handler's own retry policy: (the failed attempt's number, its exception) → delay.
BackoffPolicy = Callable[[int, BaseException], "float | timedelta"]
#: One job for `schedule_many`: a JobRequest, a mapping of its fields, or a (type, configuration) pair.
JobItem = JobRequest | Mapping[str, Any] | tuple[str, Mapping[str, Any] | None]
TERMINAL = ("completed", "failed", "cancelled")
#: A keyed insert that meets an active job committed after its snapshot asks again, this many times.
DEDUPE_ROUNDS = 10
#: Insert statements one App has in flight at once; concurrent `schedule` calls beyond share them.
BATCHES_IN_FLIGHT = 4
#: At most this many jobs of concurrent callers go in one shared statement.
BATCH_JOBS = 500
#: What reading a job raises on a schema without migration 0010's tables and columns.
_BEFORE_WORKFLOWS = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
#: The longest chain of `then=` follow-ups one request may carry.
MAX_CHAIN = 20


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered job type and the function that runs it."""

    type: str
    func: Callable[..., Any]
    is_async: bool
    defaults: JobDefaults
    #: Seconds an attempt may run (a job's own `timeout` wins); None: no limit.
    timeout: float | None = None
    #: `backoff(attempt, error)` → seconds or timedelta before the next attempt; None: the settings'.
    backoff: BackoffPolicy | None = None


class App:
    """The entry point: holds settings, handlers, listeners and the connection pool.

    ``async with app:`` opens the pool; ``app.sync`` offers the same producer and admin methods as
    blocking calls for Django, Flask and scripts.
    """

    def __init__(self, *, job_scope: JobScope | None = None, **settings: Any) -> None:
        self.settings = Settings.load(settings)
        if job_scope is not None and not callable(job_scope):
            raise ValueError(f"job_scope must be a callable returning an async context manager, got {job_scope!r}")
        self.job_scope = job_scope
        self.store = JobStore(self.settings.schema)
        self.periodic_store = PeriodicStore(self.settings.schema, self.store.channel)
        self.queue_store = QueueStore(self.settings.schema)
        self.handlers: dict[str, Handler] = {}
        #: Periodic jobs declared in code (`periodic`); workers keep the stored ones in step with these.
        self.periodics: dict[str, PeriodicSpec] = {}
        self.events = EventHub()
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._pool_users = 0
        self._batcher: InsertBatcher | None = None
        self._finished: FinishedJobs | None = None
        self.sync = SyncApp(self)

    def reconfigure(self, **changes: Any) -> Settings:
        """Change some settings of this App while it is closed; returns the settings it had before.

        For tests that point a project's own App at an isolated database or schema (`jobbus.testing`
        does): ``previous = app.reconfigure(schema="test_1")`` ... ``app.reconfigure(**previous.as_dict())``.
        Handlers, tasks, periodic jobs and listeners stay; the blocking pool is closed and reopens on
        the new settings. Values are validated as in `App(...)`.
        """
        if self._pool is not None:
            raise RuntimeError("reconfigure() needs a closed App: leave its `async with app:` first")
        unknown = sorted(set(changes) - set(Settings.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        previous = self.settings
        settings = dataclasses.replace(previous, **changes)
        self.sync.close()
        self.settings = settings
        self.store = JobStore(settings.schema)
        self.periodic_store = PeriodicStore(settings.schema, self.store.channel)
        self.queue_store = QueueStore(settings.schema)
        return previous

    # -- registry ----------------------------------------------------------------------------------

    def job(
        self,
        type: str,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        priority: int = 0,
        timeout: float | timedelta | None = None,
        backoff: BackoffPolicy | None = None,
    ) -> Callable[[F], F]:
        """Register a handler: ``async def`` receives a `JobExecution`, ``def`` a `SyncJobExecution`.

        `timeout` (seconds or a timedelta) bounds every attempt of its jobs (a job's own `timeout`
        wins); `backoff(attempt, error)` returns the delay before the next attempt (seconds or a
        timedelta) and replaces the settings' formula for this type.
        """
        defaults = JobDefaults(queue=queue, max_attempts=max_attempts, priority=priority)
        build_spec(JobRequest(type), defaults, self.settings.default_max_attempts)  # validates the options
        timeout_seconds = seconds_or_none("timeout", timeout)
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be a callable (attempt, error) -> seconds or timedelta, got {backoff!r}")

        def register(func: F) -> F:
            if type in self.handlers:
                raise ValueError(f"job type {type!r} already has a handler: {self.handlers[type].func!r}")
            is_async = inspect.iscoroutinefunction(func)
            self.handlers[type] = Handler(type, func, is_async, defaults, timeout_seconds, backoff)
            return func

        return register

    @overload
    def task(self, name: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        name: str | None = None,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        priority: int = 0,
        timeout: float | timedelta | None = None,
        backoff: BackoffPolicy | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        name: str | Callable[..., Any] | None = None,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        priority: int = 0,
        timeout: float | timedelta | None = None,
        backoff: BackoffPolicy | None = None,
    ) -> Any:
        """Register a function as a typed task: its parameters are the job's input (see `jobbus.Task`).

        ``@app.task`` or ``@app.task("mail.send", queue="mail", ...)``; the job type defaults to the
        function's ``module.qualname``. The options are those of `job`. Sync functions run in a worker
        thread, async ones in the event loop; `jobbus.current_job()` gives the running job inside.
        """
        from jobbus.tasks import Task, default_type

        def register(func: Callable[P, R]) -> Task[P, R]:
            if not callable(func) or isinstance(func, type):
                raise TypeError(f"@app.task decorates a function, got {func!r}")
            job_type = name if isinstance(name, str) else default_type(func)
            task = Task(self, func, job_type)
            self.job(
                job_type, queue=queue, max_attempts=max_attempts, priority=priority, timeout=timeout, backoff=backoff
            )(task.handler())
            return task

        if callable(name):
            return register(name)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"@app.task(name): the job type must be a string, got {name!r}")
        return register

    def periodic(
        self,
        name: str,
        *,
        type: str,
        cron: str | None = None,
        every: float | timedelta | None = None,
        configuration: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        queue: str | None = None,
        priority: int | None = None,
        overlap: bool = False,
    ) -> None:
        """Declare a periodic job in code: exactly one of `cron` (5 fields, in `timezone`) or `every`.

        Workers store it when they start (and delete code-declared ones their code no longer has, for
        the job types they handle); the leader enqueues one job per tick, fleet-wide.
        """
        if name in self.periodics:
            raise ValueError(f"periodic job {name!r} is already declared")
        self.periodics[name] = self._periodic_spec(
            name, type, cron, every, configuration, timezone, queue, priority, overlap
        )

    def _periodic_spec(
        self,
        name: str,
        job_type: str,
        cron: str | None,
        every: float | timedelta | None,
        configuration: Mapping[str, Any] | None,
        timezone: str,
        queue: str | None,
        priority: int | None,
        overlap: bool,
    ) -> PeriodicSpec:
        defaults = self.job_defaults(job_type)
        return PeriodicSpec.build(
            name,
            type=job_type,
            cron=cron,
            every=every,
            configuration=dict(configuration) if configuration is not None else None,
            timezone=timezone,
            queue=queue,
            priority=priority if priority is not None else defaults.priority,
            overlap=overlap,
            default_queue=defaults.queue,
            max_payload_bytes=self.settings.max_payload_bytes,
        )

    def max_attempts_of(self, job_type: str) -> int:
        return self.job_defaults(job_type).max_attempts or self.settings.default_max_attempts

    def on(self, event_type: type[JobEvent]) -> Callable[[F], F]:
        """Register a sync or async listener for a lifecycle event class (and its subclasses)."""
        return self.events.on(event_type)  # type: ignore[return-value]

    def job_defaults(self, job_type: str) -> JobDefaults:
        handler = self.handlers.get(job_type)
        return handler.defaults if handler else JobDefaults()

    # -- connections -------------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        if not self.settings.dsn:
            raise ValueError("dsn: no database given; pass App(dsn=...) or set JOBBUS_DSN")
        return self.settings.dsn

    async def open(self, *, timeout: float | None = None) -> None:
        """Open the connection pool (idempotent, reference-counted with `close`).

        Waits at most `timeout` seconds (default `database_wait_seconds`) for the database, then raises
        `DatabaseUnavailableError` naming why it could not connect; nothing stays open then.
        """
        self._pool_users += 1
        if self._pool is None:
            pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self.settings.pool_max_size,
                kwargs=self.settings.connection_kwargs,
                configure=configure_async,
                open=False,
                name=f"jobbus-{self.settings.schema}",
            )
            try:
                await open_pool(pool, self.dsn, self.settings.database_wait_seconds if timeout is None else timeout)
            except BaseException:
                self._pool_users -= 1
                await pool.close()
                raise
            self._pool = pool
            self._batcher = InsertBatcher(
                self._insert_now, in_flight=min(BATCHES_IN_FLIGHT, self.settings.pool_max_size), max_jobs=BATCH_JOBS
            )

    async def close(self) -> None:
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
            raise RuntimeError("the App is not open: use `async with app:` (or app.sync for blocking code)")
        return self._pool

    async def _run(
        self,
        statement: Operation[T],
        connection: psycopg.AsyncConnection[Any] | None = None,
        *,
        repeatable: bool = True,
    ) -> T:
        """Run one statement. On the App's pool, a lost connection or a busy server is waited out for at
        most `database_wait_seconds`, repeating the statement when that is safe (`repeatable`), then
        `DatabaseUnavailableError`. In the caller's own transaction nothing is repeated."""
        if connection is not None:
            if not isinstance(connection, psycopg.AsyncConnection):
                raise TypeError("connection= must be a psycopg.AsyncConnection here (use app.sync with a sync one)")
            try:
                return await run_async(connection, statement)
            except psycopg.Error as exc:
                refused(exc)
                raise
        waiting = _Waiting(self.settings.database_wait_seconds)
        while True:
            try:
                async with self.pool.connection(timeout=waiting.remaining()) as conn:
                    waiting.sent = True
                    return await run_async(conn, statement)
            except Exception as exc:
                await asyncio.sleep(waiting.after(exc, repeatable))

    # -- producers ---------------------------------------------------------------------------------

    async def schedule(
        self,
        type: str,
        configuration: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        group_id: uuid.UUID | None = None,
        unique_key: str | None = None,
        max_attempts: int | None = None,
        available_at: datetime | timedelta | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout: float | timedelta | None = None,
        concurrency_key: str | None = None,
        then: JobRequest | None = None,
        expires: float | timedelta | datetime | None = None,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> uuid.UUID:
        """Enqueue one job and return its id, or the id of the active job holding `unique_key`.

        `then`: a follow-up job, scheduled exactly once in the transaction that records this job
        `completed` (never on failure or cancellation). `expires`: seconds or a timedelta from now, or
        an aware datetime; a job not started by then never runs and ends `cancelled` ("expired").
        """
        request = JobRequest(
            type,
            configuration,
            name,
            group_id,
            unique_key,
            max_attempts,
            available_at,
            queue,
            priority,
            timeout,
            concurrency_key,
            then,
            expires,
        )
        (job_id,) = await self.schedule_many([request], connection=connection)
        return job_id

    async def schedule_many(
        self,
        jobs: Iterable[JobItem] | str,
        configurations: Iterable[Mapping[str, Any] | None] | None = None,
        *,
        connection: psycopg.AsyncConnection[Any] | None = None,
        **common: Any,
    ) -> list[uuid.UUID]:
        """Enqueue many jobs in one round trip; ids come back in input order.

        Either a list of ``JobRequest(...)``, ``{"type": ..., "configuration": ..., ...}`` or
        ``("type", configuration)`` items, or ``schedule_many("type", [config, ...], queue=..., ...)``;
        keyword options apply to every job.
        """
        specs, order = self._specs(jobs, configurations, common)
        ids = await self.insert_specs(specs, connection=connection)
        return [ids[index] for index in order]

    async def insert_specs(
        self, specs: Sequence[JobSpec], *, connection: psycopg.AsyncConnection[Any] | None = None
    ) -> list[uuid.UUID]:
        """Insert jobs already validated by `build_spec`, in one round trip; ids come back in input order.

        For producers that must validate before they act (the bus validates every job of a dispatch
        before its inline handlers run). A spec whose unique key an active job holds gets that job's id.
        """
        if not specs:
            return []
        await self._check_follow_up_groups(specs, connection)
        with tracing.producing(specs) as specs:
            found = await self._insert(specs, connection)
            for _ in range(DEDUPE_ROUNDS):
                missing = _missing(specs, found)
                if not missing:
                    break
                found.update(await self._insert(missing, connection))
            else:
                raise _dedupe_contention(specs, found)
        if self.events:
            for spec in _inserted(specs, found):
                await self.events.emit(JobScheduled(spec.id, spec.type, spec.queue))
        return _resolve_ids(specs, range(len(specs)), found)

    async def _insert(
        self, specs: Sequence[JobSpec], connection: psycopg.AsyncConnection[Any] | None
    ) -> dict[tuple[str, str], uuid.UUID]:
        """In the caller's transaction, or on the pool in a statement shared with concurrent callers."""
        if connection is not None:
            return await self._run(self.store.insert_jobs(specs), connection)
        if self._batcher is None:
            self.pool  # noqa: B018 - raises: the App is not open
            raise AssertionError("an open App has a batcher")
        return dict(await self._batcher.insert(specs))

    async def _insert_now(self, specs: Sequence[JobSpec]) -> dict[tuple[str, str], uuid.UUID]:
        return await self._run(self.store.insert_jobs(specs))

    def _specs(
        self,
        jobs: Iterable[JobItem] | str,
        configurations: Iterable[Mapping[str, Any] | None] | None,
        common: Mapping[str, Any],
    ) -> tuple[list[JobSpec], list[int]]:
        settings_default = self.settings.default_max_attempts
        limit = self.settings.max_payload_bytes
        if (
            isinstance(jobs, str)
            and configurations is not None
            and common.get("unique_key") is None
            and common.get("then") is None  # every job needs a follow-up of its own
        ):
            # One type, shared options: validate the options once, then only each configuration.
            template = build_spec(_request({**common, "type": jobs}), self.job_defaults(jobs), settings_default, limit)
            shared = specs_sharing(template, configurations, limit)
            return shared, list(range(len(shared)))
        requests = list(_requests(jobs, configurations, common))
        specs: list[JobSpec] = []
        order: list[int] = []
        first_by_key: dict[tuple[str, str], int] = {}
        for request in requests:
            spec = self.build_job_spec(request)
            if spec.unique_key is not None:
                key = (spec.type, spec.unique_key)
                if key in first_by_key:  # a repeat within the batch folds onto the first
                    order.append(first_by_key[key])
                    continue
                first_by_key[key] = len(specs)
            order.append(len(specs))
            specs.append(spec)
        return specs, order

    def build_job_spec(self, request: JobRequest, depth: int = 0) -> JobSpec:
        """Validate a request and its chain of follow-ups (each gets its id now, so it is written once)."""
        settings = self.settings
        spec = build_spec(
            request, self.job_defaults(request.type), settings.default_max_attempts, settings.max_payload_bytes
        )
        if request.then is None:
            return spec
        if not isinstance(request.then, JobRequest):
            raise InvalidJobError(f"then must be a jobbus.JobRequest, got {request.then!r:.80}")
        if depth >= MAX_CHAIN:
            raise InvalidJobError(f"a chain of then= may hold at most {MAX_CHAIN} follow-ups")
        return dataclasses.replace(spec, then=spec_json(self.build_job_spec(request.then, depth + 1)))

    async def schedule_group(
        self,
        requests: Iterable[JobItem],
        *,
        group_id: uuid.UUID | None = None,
        then: JobRequest | None = None,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> tuple[uuid.UUID, list[uuid.UUID]]:
        """Schedule jobs as one group in one round trip; returns (group id, ids in input order).

        `then` is scheduled exactly once, in the transaction that makes the last member terminal,
        whatever the members' outcomes (a group has at most one callback).
        """
        group, specs, order, callback = self._group(requests, group_id, then)
        await self._check_follow_up_groups(specs, connection)
        found = await self._run(self.store.insert_jobs(specs, callback=callback), connection)
        if _missing(specs, found):
            found.update(await self._insert(_missing(specs, found), connection))
        if self.events:
            for spec in _inserted(specs, found):
                await self.events.emit(JobScheduled(spec.id, spec.type, spec.queue))
        return group, _resolve_ids(specs, order, found)

    async def _check_follow_up_groups(
        self, specs: Sequence[JobSpec], connection: psycopg.AsyncConnection[Any] | None
    ) -> None:
        """`then=` naming a group that has a callback is refused before anything is written (one more
        round trip, only for follow-ups that name a group)."""
        groups = follow_up_groups(specs)
        if groups:
            refuse_follow_up_groups(await self._run(self.store.groups_with_callbacks(groups), connection))

    def _group(
        self, requests: Iterable[JobItem], group_id: uuid.UUID | None, then: JobRequest | None
    ) -> tuple[uuid.UUID, list[JobSpec], list[int], tuple[uuid.UUID, str | None]]:
        group = new_job_id() if group_id is None else _uuid(group_id)
        specs, order = self._specs(requests, None, {"group_id": group})
        if not specs:
            raise InvalidJobError("schedule_group needs at least one job")
        if any(spec.group_id != group for spec in specs):
            raise InvalidJobError("schedule_group: a job of the group names another group_id")
        callback = None
        if then is not None:
            if not isinstance(then, JobRequest):
                raise InvalidJobError(f"then must be a jobbus.JobRequest, got {then!r:.80}")
            if any(spec.unique_key is not None for spec in specs):
                raise InvalidJobError("schedule_group with then=: members cannot have a unique_key")
            callback = spec_json(self.build_job_spec(then))
        return group, specs, order, (group, callback)

    # -- reads and admin ---------------------------------------------------------------------------

    async def find(self, job_id: uuid.UUID) -> Job | None:
        try:
            return await self._run(self.store.find_job(_uuid(job_id)))
        except _BEFORE_WORKFLOWS:  # the schema is a migration behind (rolling deploy): read without steps
            return await self._run(self.store.find_job(_uuid(job_id), legacy=True))

    async def wait(self, job_id: uuid.UUID, timeout: float | timedelta | None = None) -> Job:
        """The job once it is terminal (with its result, error and steps); `TimeoutError` after `timeout`.

        Woken by the notification of the transaction that finished the job, through one listening
        connection per App however many callers wait; an unknown id raises `InvalidStateError`, and so
        does a job deleted before it was read terminal (retention, prune), saying so.
        """
        job_id = _uuid(job_id)
        seconds = seconds_or_none("timeout", timeout)
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        finished = self._finished_jobs()
        await finished.started(self.settings.database_wait_seconds)
        seen = notified = False
        while True:
            woken = finished.register(job_id)
            try:
                job = await self.find(job_id)
                if job is None:
                    raise InvalidStateError(vanished_message(job_id, seen=seen, woken=notified or woken.done()))
                if job.status.is_terminal:
                    return job
                seen = True
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    raise TimeoutError(timeout_message(job_id, job.status.value, seconds or 0.0))
                if finished.polling:
                    poll = self.settings.poll_interval_seconds
                    left = poll if left is None else min(left, poll)
                try:
                    await asyncio.wait_for(woken, left)
                    notified = True
                except TimeoutError:
                    if not finished.polling:
                        raise TimeoutError(timeout_message(job_id, job.status.value, seconds or 0.0)) from None
            finally:
                finished.unregister(job_id, woken)

    def _finished_jobs(self) -> FinishedJobs:
        self.pool  # noqa: B018 - raises: the App is not open
        if self._finished is None:
            settings = self.settings
            self._finished = FinishedJobs(
                settings.notification_dsn, channel_name(settings.schema, "_done"), settings.connection_kwargs
            )
        return self._finished

    async def emit_event(self, key: str, payload: Any = None) -> bool:
        """Emit an event for `job.wait_for_event(key)`: the first emit of a key wins and is kept (later
        ones change nothing); jobs waiting for it are due at once. Returns whether this was the first."""
        check_event_key(key)
        text = json_text("the event's payload", payload, self.settings.max_payload_bytes)
        return await self._run(self.store.emit_event(key, text))

    async def list_jobs(
        self,
        *,
        status: Sequence[str | JobStatus] | str | JobStatus | None = None,
        queue: Sequence[str] | str | None = None,
        type: Sequence[str] | str | None = None,
        group_id: uuid.UUID | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> list[Job]:
        """Jobs in creation order (the newest first with `newest_first`), filtered; pass the last id
        seen as `after` for the next page in the same order.

        `status` takes statuses and the views of queued jobs (`scheduled`, `retrying`, `waiting`)."""
        filters = _list_filters(status, queue, type, group_id, after, limit, newest_first)
        try:
            return await self._run(self.store.list_jobs(**filters))
        except _BEFORE_WORKFLOWS:
            return await self._run(self.store.list_jobs(**filters, legacy=True))

    async def group_progress(self, group_id: uuid.UUID) -> GroupProgress:
        return await self._run(self.store.group_progress(_uuid(group_id)))

    async def cancel(self, job_id: uuid.UUID) -> JobStatus:
        """Cancel a queued job at once, ask a running one to stop; returns the status after the call."""
        result = await self._run(self.store.cancel_job(_uuid(job_id)))
        status = _cancel_status(job_id, result)
        if result.before is JobStatus.QUEUED and result.type and result.queue:
            await self.events.emit(JobCancelled(_uuid(job_id), result.type, result.queue, JobStatus.QUEUED))
        return status

    async def retry(self, job_id: uuid.UUID, available_at: datetime | timedelta | None = None) -> None:
        """Requeue a failed job with its attempts reset; anything else raises `InvalidStateError`."""
        at, delay = resolve_available_at(available_at)
        try:
            before, done = await self._run(self.store.retry_job(_uuid(job_id), at, delay), repeatable=False)
        except psycopg.errors.UniqueViolation:
            raise InvalidStateError(
                f"job {job_id} cannot be retried: another active job holds its unique_key"
            ) from None
        _check_retry(job_id, before, done)

    async def delete(self, job_id: uuid.UUID) -> None:
        """Remove a queued or terminal job; a running one (or an unknown id) raises `InvalidStateError`.

        A queued job is ended as cancelled before it goes, in the same transaction: its group counts it
        as done (the group's callback fires once the other members are terminal), a parent waiting for
        its children no longer waits for it, and its own `then=` follow-up is not scheduled.
        """
        before = await self._run(self.store.delete_job(_uuid(job_id)), repeatable=False)
        _check_delete(job_id, before)

    async def run_now(self, job_id: uuid.UUID) -> None:
        """Make a queued job available at once (a delayed, retrying or parked one); anything else raises
        `InvalidStateError`. A job parked in a durable wait that is not over parks again when it runs."""
        before, done = await self._run(self.store.run_job_now(_uuid(job_id)))
        _check_run_now(job_id, before, done)

    async def prune(
        self, older_than: timedelta, statuses: Sequence[str | JobStatus] = ("completed", "cancelled")
    ) -> int:
        """Delete finished jobs older than `older_than` (in batches); returns how many."""
        params = _prune_params(older_than, statuses)
        total = 0
        while True:
            deleted = await self._run(self.store.prune_jobs(**params))
            total += deleted
            if deleted < params["limit"]:
                return total

    # -- queues: flow control ----------------------------------------------------------------------

    async def set_queue(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None = KEEP,
        concurrency_per_key: int | Keep | None = KEEP,
        rate_limit: RateLimit | Keep | None = KEEP,
        rate_limit_per_key: RateLimit | Keep | None = KEEP,
    ) -> QueueSettings:
        """Store a queue's limits, fleet-wide and durable; None removes one, an omitted one is kept.

        `concurrency`: at most that many of its jobs hold a valid lease at any instant;
        `concurrency_per_key`: the same per `concurrency_key` (1 serialises a key); `rate_limit` and
        `rate_limit_per_key`: at most `count` jobs started in any rolling `per` window. Running workers
        apply changes within one poll interval.
        """
        for statement in _set_queue_statements(
            self, queue, concurrency, concurrency_per_key, rate_limit, rate_limit_per_key
        ):
            await self._run(statement)
        return await self.get_queue(queue)

    async def get_queue(self, queue: str) -> QueueSettings:
        """The limits of a queue (a queue without limits has them all None)."""
        found = await self._run(self.queue_store.list_settings(validate_text("queue", queue, MAX_TYPE_BYTES)))
        return found[0] if found else QueueSettings(queue)

    async def list_queues(self) -> list[QueueSettings]:
        """Every queue that has limits."""
        return await self._run(self.queue_store.list_settings())

    async def queue_usage(self) -> dict[str, tuple[int, int | None]]:
        """Per queue with limits: jobs holding a valid lease now, and jobs started in its rate window."""
        return await self._run(self.queue_store.usage())

    # -- periodic jobs -----------------------------------------------------------------------------

    async def add_periodic(
        self,
        name: str,
        *,
        type: str,
        cron: str | None = None,
        every: float | timedelta | None = None,
        configuration: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        queue: str | None = None,
        priority: int | None = None,
        overlap: bool = False,
    ) -> Periodic:
        """Add (or redefine) a periodic job at run time, stored in the database; it survives restarts."""
        spec = self._periodic_spec(name, type, cron, every, configuration, timezone, queue, priority, overlap)
        now = await self._run(self.periodic_store.database_now())
        statement = self.periodic_store.upsert(spec, source="runtime", next_run_at=spec.schedule.next_after(now))
        if not await self._run(statement):
            raise InvalidStateError(f"periodic job {name!r} is declared in code: change it there, or pick another name")
        return await self._periodic(name)

    async def remove_periodic(self, name: str) -> None:
        """Delete a periodic job (one declared in code comes back when a worker of that code starts)."""
        if not await self._run(self.periodic_store.remove(name)):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    async def pause_periodic(self, name: str) -> None:
        """Stop enqueuing its ticks until `resume_periodic`; durable, also across redefinitions."""
        if not await self._run(self.periodic_store.set_enabled(name, False)):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    async def resume_periodic(self, name: str) -> None:
        if not await self._run(self.periodic_store.set_enabled(name, True)):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    async def list_periodic(self) -> list[Periodic]:
        return await self._run(self.periodic_store.list_periodic())

    async def run_periodic(self, name: str) -> uuid.UUID:
        """Enqueue one job of a periodic job now, beside its schedule; returns its id."""
        job_type = await self._run(self.periodic_store.periodic_type(name))
        if job_type is None:
            raise InvalidStateError(f"no periodic job is named {name!r}")
        job_id = new_job_id()
        statement = self.periodic_store.run_now(name, job_id=job_id, max_attempts=self.max_attempts_of(job_type))
        if not await self._run(statement, repeatable=False):
            raise InvalidStateError(f"no periodic job is named {name!r}")
        return job_id

    async def _periodic(self, name: str) -> Periodic:
        (found,) = await self._run(self.periodic_store.list_periodic(name))
        return found

    # -- schema ------------------------------------------------------------------------------------

    async def migrate(self) -> list[schema_module.Migration]:
        """Apply pending migrations (advisory-locked, idempotent); returns those applied."""
        return await asyncio.to_thread(self.sync.migrate)

    async def check_schema(self) -> int:
        """Raise `SchemaError` unless the schema is current; returns its version."""
        try:
            version = await self._run(self.store.schema_version())
        except psycopg.errors.UndefinedTable:
            version = 0
        schema_module.check_version(self.settings.schema, version)
        return version

    # -- worker ------------------------------------------------------------------------------------

    async def run_worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> int:
        """Run a worker in this event loop until it stops; returns its exit code (0, 70 or 75).

        A shortcut for ``await jobbus.Worker(app, ...).run()``; keep the `Worker` to stop it from outside.
        """
        from jobbus.worker.runtime import Worker

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
        """
        from jobbus.worker.options import WorkerOptions
        from jobbus.worker.runtime import EXIT_OK, Worker

        if not self.handlers:
            return {}
        counts = _OutcomeCounts()
        options = WorkerOptions(
            queues=queues, types=types, limit=max_jobs, concurrency=concurrency, stop_when_empty=True
        )
        code = await Worker(self, options, observers=[counts]).run()
        if code != EXIT_OK:
            raise JobbusError(f"drain: the worker stopped with exit code {code} before every job had run")
        return dict(counts.outcomes)


class SyncApp:
    """The blocking twin of `App`'s producer and admin methods, over its own sync pool.

    Same statements, same validation, same results; ``connection=`` takes a sync psycopg connection.
    """

    def __init__(self, app: App) -> None:
        self._app = app
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._lock = threading.Lock()
        self._finished: SyncFinishedJobs | None = None

    def _pool_or_open(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._lock:
            if self._pool is None:
                pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                    self._app.dsn,
                    min_size=1,
                    max_size=self._app.settings.pool_max_size,
                    kwargs=self._app.settings.connection_kwargs,
                    configure=configure_connection,
                    open=False,
                    name=f"jobbus-sync-{self._app.settings.schema}",
                )
                open_pool_sync(pool, self._app.dsn, self._app.settings.database_wait_seconds)
                self._pool = pool
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            finished, self._finished = self._finished, None
        if finished is not None:
            finished.close()
        if pool is not None:
            pool.close()

    def __enter__(self) -> SyncApp:
        self._pool_or_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(
        self,
        statement: Operation[T],
        connection: psycopg.Connection[Any] | None = None,
        *,
        repeatable: bool = True,
    ) -> T:
        if connection is not None:
            if not isinstance(connection, psycopg.Connection):
                raise TypeError("connection= must be a sync psycopg.Connection here (use await app.schedule otherwise)")
            try:
                return run_sync(connection, statement)
            except psycopg.Error as exc:
                refused(exc)
                raise
        waiting = _Waiting(self._app.settings.database_wait_seconds)
        while True:
            try:
                with self._pool_or_open().connection(timeout=waiting.remaining()) as conn:
                    waiting.sent = True
                    return run_sync(conn, statement)
            except Exception as exc:
                time.sleep(waiting.after(exc, repeatable))

    def schedule(
        self,
        type: str,
        configuration: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        group_id: uuid.UUID | None = None,
        unique_key: str | None = None,
        max_attempts: int | None = None,
        available_at: datetime | timedelta | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout: float | timedelta | None = None,
        concurrency_key: str | None = None,
        then: JobRequest | None = None,
        expires: float | timedelta | datetime | None = None,
        connection: psycopg.Connection[Any] | None = None,
    ) -> uuid.UUID:
        request = JobRequest(
            type,
            configuration,
            name,
            group_id,
            unique_key,
            max_attempts,
            available_at,
            queue,
            priority,
            timeout,
            concurrency_key,
            then,
            expires,
        )
        (job_id,) = self.schedule_many([request], connection=connection)
        return job_id

    def schedule_many(
        self,
        jobs: Iterable[JobItem] | str,
        configurations: Iterable[Mapping[str, Any] | None] | None = None,
        *,
        connection: psycopg.Connection[Any] | None = None,
        **common: Any,
    ) -> list[uuid.UUID]:
        specs, order = self._app._specs(jobs, configurations, common)
        ids = self.insert_specs(specs, connection=connection)
        return [ids[index] for index in order]

    def insert_specs(
        self, specs: Sequence[JobSpec], *, connection: psycopg.Connection[Any] | None = None
    ) -> list[uuid.UUID]:
        app = self._app
        if not specs:
            return []
        groups = follow_up_groups(specs)
        if groups:
            refuse_follow_up_groups(self._run(app.store.groups_with_callbacks(groups), connection))
        with tracing.producing(specs) as specs:
            found = self._run(app.store.insert_jobs(specs), connection)
            for _ in range(DEDUPE_ROUNDS):
                missing = _missing(specs, found)
                if not missing:
                    break
                more: dict[tuple[str, str], uuid.UUID] = self._run(app.store.insert_jobs(missing), connection)
                found.update(more)
            else:
                raise _dedupe_contention(specs, found)
        if app.events:
            for spec in _inserted(specs, found):
                app.events.emit_sync(JobScheduled(spec.id, spec.type, spec.queue))
        return _resolve_ids(specs, range(len(specs)), found)

    def find(self, job_id: uuid.UUID) -> Job | None:
        try:
            return self._run(self._app.store.find_job(_uuid(job_id)))
        except _BEFORE_WORKFLOWS:
            return self._run(self._app.store.find_job(_uuid(job_id), legacy=True))

    def wait(self, job_id: uuid.UUID, timeout: float | timedelta | None = None) -> Job:
        job_id = _uuid(job_id)
        settings = self._app.settings
        seconds = seconds_or_none("timeout", timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        self._pool_or_open()
        with self._lock:
            if self._finished is None:
                self._finished = SyncFinishedJobs(
                    settings.notification_dsn, channel_name(settings.schema, "_done"), settings.connection_kwargs
                )
            finished = self._finished
        finished.started(settings.database_wait_seconds)
        seen = notified = False
        while True:
            woken = finished.register(job_id)
            try:
                job = self.find(job_id)
                if job is None:
                    raise InvalidStateError(vanished_message(job_id, seen=seen, woken=notified or woken.is_set()))
                if job.status.is_terminal:
                    return job
                seen = True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(timeout_message(job_id, job.status.value, seconds or 0.0))
                if finished.polling:
                    poll = settings.poll_interval_seconds
                    left = poll if left is None else min(left, poll)
                notified = woken.wait(left)
                if not notified and not finished.polling:
                    raise TimeoutError(timeout_message(job_id, job.status.value, seconds or 0.0))
            finally:
                finished.unregister(job_id, woken)

    def emit_event(self, key: str, payload: Any = None) -> bool:
        check_event_key(key)
        text = json_text("the event's payload", payload, self._app.settings.max_payload_bytes)
        return self._run(self._app.store.emit_event(key, text))

    def schedule_group(
        self,
        requests: Iterable[JobItem],
        *,
        group_id: uuid.UUID | None = None,
        then: JobRequest | None = None,
        connection: psycopg.Connection[Any] | None = None,
    ) -> tuple[uuid.UUID, list[uuid.UUID]]:
        app = self._app
        group, specs, order, callback = app._group(requests, group_id, then)
        groups = follow_up_groups(specs)
        if groups:
            refuse_follow_up_groups(self._run(app.store.groups_with_callbacks(groups), connection))
        found = self._run(app.store.insert_jobs(specs, callback=callback), connection)
        if _missing(specs, found):
            again = app.store.insert_jobs(_missing(specs, found))
            more: dict[tuple[str, str], uuid.UUID] = self._run(again, connection)
            found.update(more)
        if app.events:
            for spec in _inserted(specs, found):
                app.events.emit_sync(JobScheduled(spec.id, spec.type, spec.queue))
        return group, _resolve_ids(specs, order, found)

    def list_jobs(
        self,
        *,
        status: Sequence[str | JobStatus] | str | JobStatus | None = None,
        queue: Sequence[str] | str | None = None,
        type: Sequence[str] | str | None = None,
        group_id: uuid.UUID | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> list[Job]:
        filters = _list_filters(status, queue, type, group_id, after, limit, newest_first)
        try:
            return self._run(self._app.store.list_jobs(**filters))
        except _BEFORE_WORKFLOWS:
            return self._run(self._app.store.list_jobs(**filters, legacy=True))

    def group_progress(self, group_id: uuid.UUID) -> GroupProgress:
        return self._run(self._app.store.group_progress(_uuid(group_id)))

    def cancel(self, job_id: uuid.UUID) -> JobStatus:
        result = self._run(self._app.store.cancel_job(_uuid(job_id)))
        status = _cancel_status(job_id, result)
        if result.before is JobStatus.QUEUED and result.type and result.queue:
            self._app.events.emit_sync(JobCancelled(_uuid(job_id), result.type, result.queue, JobStatus.QUEUED))
        return status

    def retry(self, job_id: uuid.UUID, available_at: datetime | timedelta | None = None) -> None:
        at, delay = resolve_available_at(available_at)
        try:
            before, done = self._run(self._app.store.retry_job(_uuid(job_id), at, delay), repeatable=False)
        except psycopg.errors.UniqueViolation:
            raise InvalidStateError(
                f"job {job_id} cannot be retried: another active job holds its unique_key"
            ) from None
        _check_retry(job_id, before, done)

    def delete(self, job_id: uuid.UUID) -> None:
        """Remove a queued or terminal job; a running one (or an unknown id) raises `InvalidStateError`."""
        before = self._run(self._app.store.delete_job(_uuid(job_id)), repeatable=False)
        _check_delete(job_id, before)

    def run_now(self, job_id: uuid.UUID) -> None:
        """Make a queued job available at once; anything else raises `InvalidStateError`."""
        before, done = self._run(self._app.store.run_job_now(_uuid(job_id)))
        _check_run_now(job_id, before, done)

    def prune(self, older_than: timedelta, statuses: Sequence[str | JobStatus] = ("completed", "cancelled")) -> int:
        params = _prune_params(older_than, statuses)
        total = 0
        while True:
            deleted = self._run(self._app.store.prune_jobs(**params))
            total += deleted
            if deleted < params["limit"]:
                return total

    def set_queue(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None = KEEP,
        concurrency_per_key: int | Keep | None = KEEP,
        rate_limit: RateLimit | Keep | None = KEEP,
        rate_limit_per_key: RateLimit | Keep | None = KEEP,
    ) -> QueueSettings:
        app = self._app
        for statement in _set_queue_statements(
            app, queue, concurrency, concurrency_per_key, rate_limit, rate_limit_per_key
        ):
            self._run(statement)
        return self.get_queue(queue)

    def get_queue(self, queue: str) -> QueueSettings:
        found = self._run(self._app.queue_store.list_settings(validate_text("queue", queue, MAX_TYPE_BYTES)))
        return found[0] if found else QueueSettings(queue)

    def list_queues(self) -> list[QueueSettings]:
        return self._run(self._app.queue_store.list_settings())

    def add_periodic(
        self,
        name: str,
        *,
        type: str,
        cron: str | None = None,
        every: float | timedelta | None = None,
        configuration: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        queue: str | None = None,
        priority: int | None = None,
        overlap: bool = False,
    ) -> Periodic:
        app = self._app
        spec = app._periodic_spec(name, type, cron, every, configuration, timezone, queue, priority, overlap)
        now = self._run(app.periodic_store.database_now())
        if not self._run(app.periodic_store.upsert(spec, source="runtime", next_run_at=spec.schedule.next_after(now))):
            raise InvalidStateError(f"periodic job {name!r} is declared in code: change it there, or pick another name")
        (found,) = self._run(app.periodic_store.list_periodic(name))
        return found

    def remove_periodic(self, name: str) -> None:
        if not self._run(self._app.periodic_store.remove(name)):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    def pause_periodic(self, name: str) -> None:
        if not self._run(self._app.periodic_store.set_enabled(name, False)):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    def resume_periodic(self, name: str) -> None:
        if not self._run(self._app.periodic_store.set_enabled(name, True)):
            raise InvalidStateError(f"no periodic job is named {name!r}")

    def list_periodic(self) -> list[Periodic]:
        return self._run(self._app.periodic_store.list_periodic())

    def run_periodic(self, name: str) -> uuid.UUID:
        app = self._app
        job_type = self._run(app.periodic_store.periodic_type(name))
        if job_type is None:
            raise InvalidStateError(f"no periodic job is named {name!r}")
        job_id = new_job_id()
        statement = app.periodic_store.run_now(name, job_id=job_id, max_attempts=app.max_attempts_of(job_type))
        if not self._run(statement, repeatable=False):
            raise InvalidStateError(f"no periodic job is named {name!r}")
        return job_id

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

    def migrate(self) -> list[schema_module.Migration]:
        with psycopg.connect(self._app.dsn, **self._app.settings.connection_kwargs) as conn:
            return schema_module.migrate(conn, self._app.settings.schema)

    def check_schema(self) -> int:
        try:
            version = self._run(self._app.store.schema_version())
        except psycopg.errors.UndefinedTable:
            version = 0
        schema_module.check_version(self._app.settings.schema, version)
        return version


# -- helpers shared by both front-ends --------------------------------------------------------------


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


class _Waiting:
    """One App call waiting out an unreachable database, within `database_wait_seconds`."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.sent = False  # a statement went out at least once: it may have been applied
        self.backoff = Backoff(first=0.05, cap=1.0)

    def remaining(self) -> float:
        return max(0.05, self.deadline - time.monotonic())

    def after(self, exc: Exception, repeatable: bool) -> float:
        """Re-raise what cannot be waited out; otherwise how long to sleep before the next try."""
        refused(exc)
        if not is_transient(exc):
            raise exc
        left = self.deadline - time.monotonic()
        if left <= 0 or (self.sent and not repeatable):
            written = None if self.sent else False
            outcome = "its outcome is unknown" if self.sent else "nothing was written"
            raise DatabaseUnavailableError(
                f"the database is unavailable ({type(exc).__name__}: {first_line(exc)}); {outcome}",
                written=written,
            ) from exc
        return min(self.backoff.next_delay(), left)


def follow_up_groups(specs: Sequence[JobSpec]) -> list[uuid.UUID]:
    """The group ids the follow-ups (`then=`, at any depth) of `specs` name."""
    groups: set[uuid.UUID] = set()
    for spec in specs:
        then = json.loads(spec.then) if spec.then is not None else None
        while isinstance(then, dict):
            if then.get("group_id") is not None:
                groups.add(uuid.UUID(then["group_id"]))
            then = then.get("then")
    return sorted(groups)


def refuse_follow_up_groups(groups: list[uuid.UUID]) -> None:
    if groups:
        raise InvalidStateError(
            f"group {groups[0]} has a callback: its members are the jobs schedule_group scheduled with it "
            "(a then= follow-up cannot join it)"
        )


def refused(exc: Exception) -> None:
    """Raise the schema's refusal of a group (SQLSTATE `GROUP_REFUSED`) as `InvalidStateError`."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == GROUP_REFUSED:
        raise InvalidStateError(exc.diag.message_primary or str(exc)) from None


def _set_queue_statements(
    app: App,
    queue: str,
    concurrency: int | Keep | None,
    concurrency_per_key: int | Keep | None,
    rate_limit: RateLimit | Keep | None,
    rate_limit_per_key: RateLimit | Keep | None,
) -> list[Statement[None]]:
    return app.queue_store.set_limits(
        validate_text("queue", queue, MAX_TYPE_BYTES),
        concurrency=check_count("concurrency", concurrency),
        concurrency_per_key=check_count("concurrency_per_key", concurrency_per_key),
        rate_limit=check_rate("rate_limit", rate_limit),
        rate_limit_per_key=check_rate("rate_limit_per_key", rate_limit_per_key),
    )


def _missing(specs: Sequence[JobSpec], found: Mapping[tuple[str, str], uuid.UUID]) -> list[JobSpec]:
    """Keyed specs that met an active job this statement could not see: ask again in a new one."""
    return [s for s in specs if s.unique_key is not None and (s.type, s.unique_key) not in found]


def _dedupe_contention(specs: Sequence[JobSpec], found: Mapping[tuple[str, str], uuid.UUID]) -> JobbusError:
    keys = ", ".join(f"{s.type}/{s.unique_key}" for s in _missing(specs, found)[:3])
    return JobbusError(
        f"unique_key {keys}: an active job holds it but this transaction cannot see it (a REPEATABLE READ or "
        "SERIALIZABLE transaction that started before it): retry the transaction"
    )


def _requests(
    jobs: Iterable[JobItem] | str,
    configurations: Iterable[Mapping[str, Any] | None] | None,
    common: Mapping[str, Any],
) -> Iterable[JobRequest]:
    if isinstance(jobs, str):
        if configurations is None:
            raise InvalidJobError("schedule_many(type, configurations): configurations are missing")
        for configuration in configurations:
            yield _request({**common, "type": jobs, "configuration": configuration})
        return
    if configurations is not None:
        raise InvalidJobError("schedule_many takes either (type, configurations) or a list of job requests")
    for job in jobs:
        if isinstance(job, JobRequest):
            yield job if not common else _request({**common, **_fields(job)})
        elif isinstance(job, Mapping):
            yield _request({**common, **job})
        elif isinstance(job, tuple) and 1 <= len(job) <= 2:  # ("type", configuration)
            yield _request({**common, **dict(zip(("type", "configuration"), job, strict=False))})
        else:
            raise InvalidJobError(
                f"schedule_many: each job must be a JobRequest, a mapping or a (type, configuration) tuple, "
                f"got {job!r:.80}"
            )


def _fields(request: JobRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in JobRequest.__slots__ if getattr(request, name) is not None}


def _request(values: Mapping[str, Any]) -> JobRequest:
    try:
        return JobRequest(**values)
    except TypeError as exc:
        raise InvalidJobError(f"schedule_many: {exc}") from None


def _job_id(spec: JobSpec, found: Mapping[tuple[str, str], uuid.UUID]) -> uuid.UUID:
    """The id a spec ended up with: its own, or that of the active job holding its unique key."""
    return spec.id if spec.unique_key is None else found.get((spec.type, spec.unique_key), spec.id)


def _resolve_ids(
    specs: Sequence[JobSpec], order: Sequence[int], found: Mapping[tuple[str, str], uuid.UUID]
) -> list[uuid.UUID]:
    ids = [_job_id(spec, found) for spec in specs]
    return [ids[index] for index in order]


def _inserted(specs: Sequence[JobSpec], found: Mapping[tuple[str, str], uuid.UUID]) -> list[JobSpec]:
    """The specs that became new rows (a deduplicated one maps to another job's id)."""
    return [spec for spec in specs if _job_id(spec, found) == spec.id]


def _uuid(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidJobError(f"not a job id (UUID): {value!r}") from None


def _cancel_status(job_id: uuid.UUID, result: CancelResult) -> JobStatus:
    if result.after is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    return result.after


def _check_retry(job_id: uuid.UUID, before: JobStatus | None, done: bool) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if not done:
        raise InvalidStateError(f"job {job_id} is {before.value}; only failed jobs can be retried")


def _check_delete(job_id: uuid.UUID, before: JobStatus | None) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if before is JobStatus.RUNNING:
        raise InvalidStateError(f"job {job_id} is running; cancel it first, delete it once it has stopped")


def _check_run_now(job_id: uuid.UUID, before: JobStatus | None, done: bool) -> None:
    if before is None:
        raise InvalidStateError(f"job {job_id} does not exist")
    if not done:
        raise InvalidStateError(f"job {job_id} is {before.value}; only queued jobs can be run now")


def _list_filters(
    status: Sequence[str | JobStatus] | str | JobStatus | None,
    queue: Sequence[str] | str | None,
    type: Sequence[str] | str | None,
    group_id: uuid.UUID | None,
    after: uuid.UUID | None,
    limit: int,
    newest_first: bool,
) -> dict[str, Any]:
    def many(value: Any) -> list[str] | None:  # JobStatus is a StrEnum: str() gives its value
        if value is None:
            return None
        return [str(value)] if isinstance(value, str) else [str(v) for v in value]

    wanted = many(status)
    for s in wanted or []:
        if s not in JOB_VIEWS:
            JobStatus(s)
    statuses = [s for s in wanted or [] if s not in JOB_VIEWS] or None
    views = [s for s in wanted or [] if s in JOB_VIEWS] or None
    if not 1 <= limit <= 10_000:
        raise InvalidJobError(f"limit must be between 1 and 10000, got {limit}")
    return {
        "statuses": statuses,
        "views": views,
        "queues": many(queue),
        "types": many(type),
        "group_id": _uuid(group_id) if group_id is not None else None,
        "after": _uuid(after) if after is not None else None,
        "limit": limit,
        "newest_first": bool(newest_first),
    }


def _prune_params(older_than: timedelta, statuses: Sequence[str | JobStatus]) -> dict[str, Any]:
    if not isinstance(older_than, timedelta) or older_than.total_seconds() < 0:
        raise InvalidJobError(f"older_than must be a non-negative timedelta, got {older_than!r}")
    names = [JobStatus(s).value for s in statuses]
    active = [s for s in names if s not in TERMINAL]
    if active:
        raise InvalidJobError(f"prune removes finished jobs only; {', '.join(active)} is not a finished status")
    return {"older_than_seconds": older_than.total_seconds(), "statuses": names, "limit": 10_000}
