"""The registry: the job types an App handles, its periodic jobs, its listeners and its job scope.

`App`'s decorators (`job`, `task`, `periodic`, `on`) fill it. A worker runs what it holds, reading
it with the settings and the stores, never the App; the producer verbs build their job specs from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack

from jobbus.cells import Placement, cell_tag, tagged
from jobbus.durations import seconds_or_none
from jobbus.encryption import Keyring, keyring_of
from jobbus.errors import InvalidJobError
from jobbus.events import EventHub
from jobbus.models import JobSpec
from jobbus.periodic import PeriodicOptions, PeriodicSpec
from jobbus.requests import JobDefaults, JobRequest, build_spec, check_options, seal_spec, spec_json
from jobbus.settings import Settings
from jobbus.tasks import Task, TaskProducer, default_type

F = TypeVar("F", bound=Callable[..., Any])
#: `App(cell_router=...)`: the cell of a job from its type and configuration (SPEC 23: a database per
#: tenant), or None to leave it to `queue_cells` and the first cell.
CellRouter = Callable[[str, Mapping[str, Any]], "str | None"]
P = ParamSpec("P")
R = TypeVar("R")
#: `App(job_scope=...)`: the running job → the async context manager whose value is its `job.scope`.
JobScope = Callable[[Any], AbstractAsyncContextManager[Any]]
#: A handler's own retry policy: (the failed attempt's number, its exception) → delay.
BackoffPolicy = Callable[[int, BaseException], "float | timedelta"]
#: The longest chain of `then=` follow-ups one request may carry.
MAX_CHAIN = 20


class HandlerOptions(TypedDict, total=False):
    """What `App.job` and `App.task` say about a job type. Its jobs' `queue` ("default"),
    `max_attempts` (None: the settings' `default_max_attempts`) and `priority` (0) when the producer
    does not say; `timeout`, seconds or a timedelta that bounds every attempt (a job's own wins);
    `backoff(attempt, error)`, the delay before the next attempt (seconds or a timedelta) in place of
    the settings' formula. `batch_size` (an integer, 1 or more) makes the handler a batch handler,
    called with a `JobBatch` of up to that many jobs claimed together; `batch_wait` (seconds or a
    timedelta, default 0) waits up to that long for more once a batch has its first job."""

    queue: str
    max_attempts: int | None
    priority: int
    timeout: float | timedelta | None
    backoff: BackoffPolicy | None
    batch_size: int | None
    batch_wait: float | timedelta


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
    #: A batch handler's most jobs per call (None: not a batch handler, called with one job).
    batch_size: int | None = None
    #: Seconds a batch short of `batch_size` waits for more jobs after its first.
    batch_wait: float = 0.0


#: The largest `batch_size`: a batch's jobs are claimed, leased and renewed together.
MAX_BATCH_SIZE = 10_000


def batch_options(batch_size: object, batch_wait: object) -> tuple[int | None, float]:
    """`batch_size` and `batch_wait` checked: an integer from 1 to `MAX_BATCH_SIZE`, and seconds or a
    timedelta (0 or more) that only a batch handler may have."""
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE
    ):
        raise InvalidJobError(f"batch_size must be an integer from 1 to {MAX_BATCH_SIZE}, got {batch_size!r:.80}")
    if batch_wait is None:
        return batch_size, 0.0
    if not isinstance(batch_wait, int | float | timedelta) or isinstance(batch_wait, bool):
        raise InvalidJobError(f"batch_wait must be seconds (a number) or a timedelta, got {batch_wait!r:.80}")
    wait = seconds_or_none("batch_wait", batch_wait, allow_zero=True) or 0.0
    if wait and batch_size is None:
        raise InvalidJobError("batch_wait is for batch handlers: give batch_size too")
    return batch_size, wait


class Registry:
    """What an App handles and declares, and the job defaults that follow from it.

    `settings` are the App's (`App.reconfigure` replaces them here too): they fill in what a handler
    leaves open (`default_max_attempts`) and bound every payload (`max_payload_bytes`).
    """

    def __init__(self, settings: Settings, job_scope: JobScope | None = None) -> None:
        if job_scope is not None and not callable(job_scope):
            raise ValueError(f"job_scope must be a callable returning an async context manager, got {job_scope!r}")
        keyring_of(settings.encryption_keys)  # bad keys or a missing cryptography package fail here
        self.settings = settings
        self.job_scope = job_scope
        self.handlers: dict[str, Handler] = {}
        #: Periodic jobs declared in code (`periodic`); workers keep the stored ones in step with these.
        self.periodics: dict[str, PeriodicSpec] = {}
        self.events = EventHub()
        #: With cells (SPEC 23): where jobs go, and the registry of each cell (sharing what is declared).
        self.placement: Placement | None = None
        self.cell_registries: dict[str, Registry] = {}
        #: The cell this registry builds jobs for (a cell App's), and that cell's id tag.
        self.cell: str | None = None
        self.cell_tag = 0
        #: A cell's registry: the placement of the App it belongs to (where its periodic jobs live).
        self.home: Placement | None = None
        #: The App's routing function (an App with cells): consulted for a job given no `cell=`.
        self.cell_router: CellRouter | None = None
        if settings.cells:
            self.placement = Placement.of(settings.cells, settings.queue_cells)

    def for_cell(self, name: str, settings: Settings) -> Registry:
        """The registry of one cell: the same handlers, periodic declarations, listeners and job scope
        (the same dicts, so what is declared later is seen), its own settings, its jobs' ids tagged."""
        registry = Registry(settings, self.job_scope)
        registry.handlers = self.handlers
        registry.periodics = self.periodics
        registry.events = self.events
        registry.cell = name
        registry.cell_tag = cell_tag(name)
        registry.home = self.placement
        self.cell_registries[name] = registry
        return registry

    def periodics_here(self) -> dict[str, PeriodicSpec]:
        """The periodic jobs declared in code that live in this registry's database: all of them without
        cells; in a cell, those whose queue the App's `queue_cells` places there (SPEC 23: a periodic job
        lives in its queue's cell and ticks there alone)."""
        if self.cell is None or self.home is None:
            return self.periodics
        home = self.home
        return {name: spec for name, spec in self.periodics.items() if home.cell_for(None, spec.queue) == self.cell}

    # -- declaring ---------------------------------------------------------------------------------

    def job(self, type: str, **options: Unpack[HandlerOptions]) -> Callable[[F], F]:
        """`App.job`: the options are checked now, the function is registered when decorated."""
        check_options("app.job()", options, HandlerOptions.__optional_keys__)
        defaults = JobDefaults(
            queue=options.get("queue", "default"),
            max_attempts=options.get("max_attempts"),
            priority=options.get("priority", 0),
        )
        build_spec(JobRequest(type), defaults, self.settings.default_max_attempts)  # validates the options
        timeout_seconds = seconds_or_none("timeout", options.get("timeout"))
        backoff = options.get("backoff")
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be a callable (attempt, error) -> seconds or timedelta, got {backoff!r}")
        batch_size, batch_wait = batch_options(options.get("batch_size"), options.get("batch_wait"))

        def register(func: F) -> F:
            if type in self.handlers:
                raise ValueError(f"job type {type!r} already has a handler: {self.handlers[type].func!r}")
            is_async = inspect.iscoroutinefunction(func)
            self.handlers[type] = Handler(
                type, func, is_async, defaults, timeout_seconds, backoff, batch_size, batch_wait
            )
            return func

        return register

    def task(
        self,
        producer: TaskProducer,
        func: Callable[P, R],
        name: str | None = None,
        **options: Unpack[HandlerOptions],
    ) -> Task[P, R]:
        """`App.task`: `func` as a `Task` that defers its jobs through `producer`, and its handler."""
        if not callable(func) or isinstance(func, type):
            raise TypeError(f"@app.task decorates a function, got {func!r}")
        batch = options.get("batch_size") is not None
        task = Task(producer, func, name if name is not None else default_type(func), batch=batch)
        self.job(task.type, **options)(task.handler())
        return task

    def periodic(self, name: str, *, type: str, **options: Unpack[PeriodicOptions]) -> None:
        """`App.periodic`: declare a periodic job in code (a name is declared once)."""
        if name in self.periodics:
            raise ValueError(f"periodic job {name!r} is already declared")
        self.periodics[name] = self.periodic_spec(name, type, **options)

    # -- what follows from it ----------------------------------------------------------------------

    @property
    def keyring(self) -> Keyring | None:
        """The keys payloads are sealed and opened with (`jobbus.encryption`), or None without keys."""
        return keyring_of(self.settings.encryption_keys)

    def keyring_or_fail(self) -> Keyring:
        keyring = self.keyring
        assert keyring is not None, "called with encryption_keys set"
        return keyring

    def job_defaults(self, job_type: str) -> JobDefaults:
        handler = self.handlers.get(job_type)
        return handler.defaults if handler else JobDefaults()

    def max_attempts_of(self, job_type: str) -> int:
        return self.job_defaults(job_type).max_attempts or self.settings.default_max_attempts

    def build_job_spec(self, request: JobRequest, depth: int = 0) -> JobSpec:
        """Validate a request and its chain of follow-ups (each gets its id now, so it is written once).

        With cells, the request is placed (`Placement.cell_for`) and built by its cell's registry; a cell's
        registry tags the ids it makes with the cell and refuses a `cell=` naming another cell: follow-ups,
        children and group members stay in their parent's cell."""
        if self.placement is not None:
            cell = self.cell_for(request.cell, request.queue, request.type, request.configuration)
            return self.cell_registries[cell].build_job_spec(request, depth)
        settings = self.settings
        spec = build_spec(
            request, self.job_defaults(request.type), settings.default_max_attempts, settings.max_payload_bytes
        )
        if request.cell is not None or self.cell is not None:
            spec = dataclasses.replace(spec, id=self.cell_job_id(spec.id, request.cell))
        if settings.encryption_keys:
            spec = seal_spec(spec, self.keyring_or_fail(), settings.max_payload_bytes)
        if request.then is None:
            return spec
        if not isinstance(request.then, JobRequest):
            raise InvalidJobError(f"then must be a jobbus.JobRequest, got {request.then!r:.80}")
        if depth >= MAX_CHAIN:
            raise InvalidJobError(f"a chain of then= may hold at most {MAX_CHAIN} follow-ups")
        return dataclasses.replace(spec, then=spec_json(self.build_job_spec(request.then, depth + 1)))

    def cell_for(
        self, cell: object, queue: object, job_type: object, configuration: Mapping[str, Any] | None = None
    ) -> str:
        """The cell a job goes to (an App with cells): its `cell`, else the routing function's answer, else
        its queue's (the handler's queue when none is given), else the first. An answer of the router
        that is no cell raises `InvalidJobError` naming it, before anything is written."""
        assert self.placement is not None, "called with cells"
        if cell is None and self.cell_router is not None and isinstance(job_type, str):
            routed = self.cell_router(job_type, configuration if configuration is not None else {})
            if routed is not None:
                if not isinstance(routed, str) or routed not in self.placement.names:
                    raise InvalidJobError(
                        f"cell_router placed a job of type {job_type!r} in {routed!r}, which is not one of this "
                        f"App's cells ({', '.join(self.placement.names)})"
                    )
                return routed
        if queue is None and isinstance(job_type, str):
            queue = self.job_defaults(job_type).queue
        return self.placement.cell_for(cell, queue)

    def cell_job_id(self, job_id: uuid.UUID, cell: object = None) -> uuid.UUID:
        """`job_id` tagged with this registry's cell; `cell=` must name that cell (or be None)."""
        if self.cell is None:
            raise InvalidJobError(f"cell={cell!r}: this App has no cells (configure App(cells=...) to place jobs)")
        if cell is not None and cell != self.cell:
            raise InvalidJobError(
                f"cell={cell!r}: this job goes to cell {self.cell!r} (a follow-up, child or group member stays in "
                "its parent's cell, and a cell's App writes in its own database only)"
            )
        return tagged(job_id, self.cell_tag)

    def periodic_spec(self, name: str, job_type: str, **options: Unpack[PeriodicOptions]) -> PeriodicSpec:
        """A periodic job, validated; its queue and priority default to its handler's."""
        check_options("periodic job", options, PeriodicOptions.__optional_keys__)
        defaults = self.job_defaults(job_type)
        return PeriodicSpec.build(
            name,
            type=job_type,
            default_queue=defaults.queue,
            default_priority=defaults.priority,
            max_payload_bytes=self.settings.max_payload_bytes,
            **options,
        )
