"""Typed tasks: a function whose parameters are the job's input, deferred with checked arguments.

``@app.task(...)`` turns a function into a `Task`. ``await task.defer(order_id=42)`` binds the
arguments to the function's signature (a wrong or missing argument is a `TypeError` and nothing is
written), encodes each one by its annotation through `jobbus.encoding` (the bus's encoding layer:
dataclasses, TypedDicts, pydantic models, UUID, datetime, Decimal, ... exact or refused) and enqueues
one job whose configuration maps each given parameter name to its JSON value. A worker decodes them
back by the same annotations and calls the function; its return value is the job's result.

Parameters left out at defer time are not stored: the function's defaults apply when the job runs.
The job type is ``module.qualname`` unless named; it is what workers claim by, so keep it stable
(name the task) before moving or renaming a function that has jobs queued.
"""

from __future__ import annotations

import functools
import inspect
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, Unpack, cast

import psycopg

from jobbus import encoding
from jobbus.durations import resolve_available_at, seconds_or_none
from jobbus.encoding import EncodingError
from jobbus.errors import InvalidJobError, NonRetryableError
from jobbus.execution import JobBatch, JobExecution, SyncJobExecution
from jobbus.requests import JobOptions, check_options

P = ParamSpec("P")
R = TypeVar("R")
#: The caller's connection for ``options(connection=...)``: async for `defer`, sync for `defer_sync`.
Connection = psycopg.AsyncConnection[Any] | psycopg.Connection[Any]

_KINDS = inspect.Parameter


class BlockingScheduler(Protocol):
    """The blocking `schedule` of an App's `sync`."""

    def schedule(self, type: str, *args: Any, **kwargs: Any) -> uuid.UUID: ...


class TaskProducer(Protocol):
    """What a task enqueues its jobs through: an `App`, whose `schedule(type, configuration, *,
    connection=None, **options)` it calls (its `sync` one for `defer_sync` and the Celery verbs)."""

    async def schedule(self, type: str, *args: Any, **kwargs: Any) -> uuid.UUID: ...

    @property
    def sync(self) -> BlockingScheduler: ...


@dataclass(frozen=True, slots=True)
class _Parameter:
    name: str
    kind: inspect._ParameterKind
    #: The type its JSON value is decoded into: the annotation, a tuple of it for ``*args``, a dict of
    #: it for ``**kwargs``; `Any` (JSON values as they are) when unannotated.
    type: Any


class Task(Generic[P, R]):
    """A function registered as a job type; call it directly, or `defer` it to a worker.

    Typed by the function's signature (`ParamSpec`): mypy checks the arguments of `defer`,
    `defer_sync`, `delay` and ``options(...).defer`` as it checks a call of the function itself.
    """

    def __init__(self, app: TaskProducer, func: Callable[P, R], type: str, *, batch: bool = False) -> None:
        self.app = app
        self.func = func
        self.type = type
        #: A batch task (`batch_size=`): its function is called with a `JobBatch` (see `handler`).
        self.batch = batch
        self.is_async = inspect.iscoroutinefunction(func)
        self._signature = inspect.signature(func)
        self._resolved: dict[str, _Parameter] | None = None
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        return f"<jobbus.Task {self.type}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now, as a plain call (no job)."""
        return self.func(*args, **kwargs)

    # -- producing ----------------------------------------------------------------------------------

    def options(self, *, connection: Connection | None = None, **options: Unpack[JobOptions]) -> TaskOptions[P, R]:
        """This task with per-job options (those of `App.schedule`, see `JobOptions`); chain `.defer(...)`
        on it. An option given as None is left as it was.

        `connection` is a psycopg connection inside the caller's open transaction: an async one for
        `defer`, a sync one for `defer_sync`. The job commits, or rolls back, with that transaction.
        """
        check_options("task.options()", options, JobOptions.__optional_keys__)
        given = cast(JobOptions, {key: value for key, value in options.items() if value is not None})
        return TaskOptions(self, given, connection)

    async def defer(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """Enqueue one job of this task; returns its id (or, with a `unique_key`, the active holder's)."""
        return await TaskOptions(self).defer(*args, **kwargs)

    def defer_sync(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """`defer` for blocking code (Django views, scripts), through `app.sync`."""
        return TaskOptions(self).defer_sync(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """Celery's name for `defer_sync`: enqueue one job, blocking; returns its id."""
        return TaskOptions(self).defer_sync(*args, **kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: float | timedelta | None = None,
        eta: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> uuid.UUID:
        """Celery's `apply_async`: enqueue one job with these arguments and options; returns its id.

        Blocking, as Celery's is (async code awaits ``options(...).defer(...)``). `countdown` (seconds or
        a timedelta, 0 or more) and `eta` (an aware datetime) say when it may start, one or the other;
        `expires` as in `App.schedule`. `args` and `kwargs` are checked against the function's signature
        and annotations when called (`TypeError`, nothing written), not by mypy: use `delay` or
        ``options(...).defer_sync(...)`` for arguments mypy checks.
        """
        if countdown is not None and eta is not None:
            raise InvalidJobError("apply_async takes countdown or eta, not both")
        available_at: datetime | timedelta | None = eta
        if countdown is not None:
            seconds = seconds_or_none("countdown", countdown, allow_zero=True)
            available_at = None if not seconds else timedelta(seconds=seconds)
        elif eta is not None:
            if not isinstance(eta, datetime):
                raise InvalidJobError(f"eta must be an aware datetime, got {eta!r}")
            resolve_available_at(eta, "eta")  # a naive or out-of-range eta is refused by its own name
        if args is not None and (isinstance(args, str | bytes) or not isinstance(args, Sequence)):
            raise TypeError(f"task {self.type}: apply_async args must be a list or tuple, got {args!r:.80}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"task {self.type}: apply_async kwargs must be a dict, got {kwargs!r:.80}")
        options = self.options(available_at=available_at, expires=expires, queue=queue, priority=priority)
        configuration = self.configuration(*(args or ()), **(kwargs or {}))
        return self.app.sync.schedule(self.type, configuration, **options.values)

    def configuration(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The job configuration for these arguments: parameter name → JSON value, checked exactly.

        Raises `TypeError` when the arguments do not fit the signature or a value does not fit its
        annotation (or would not come back equal from JSON).
        """
        if self.batch:
            raise TypeError(
                f"task {self.type} is a batch task: its function takes the JobBatch, not a job's arguments; "
                f"schedule its jobs with app.schedule({self.type!r}, configuration) and read each one's "
                "job.configuration in the batch"
            )
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"task {self.type}: {exc}") from None
        parameters = self._parameters()
        configuration: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            try:
                configuration[name] = encoding.encode(value, parameters[name].type, what=f"argument {name!r}")
            except EncodingError as exc:
                raise TypeError(f"task {self.type}: {exc}") from None
        return configuration

    # -- running ------------------------------------------------------------------------------------

    def arguments(self, configuration: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments stored in a job's configuration, decoded by annotation.

        Raises `NonRetryableError` when they no longer fit the function (its signature changed since
        the job was deferred): running the job again would not help.
        """
        parameters = self._parameters()
        unknown = sorted(set(configuration) - set(parameters))
        if unknown:
            raise NonRetryableError(
                f"task {self.type}: the job has arguments the function no longer takes: {', '.join(unknown)}"
            )
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, parameter in parameters.items():
            if name not in configuration:
                continue
            try:
                value = encoding.decode(configuration[name], parameter.type, what=f"argument {name!r}")
            except EncodingError as exc:
                raise NonRetryableError(f"task {self.type}: {exc}") from None
            if parameter.kind is _KINDS.POSITIONAL_ONLY:
                args.append(value)
            elif parameter.kind is _KINDS.VAR_POSITIONAL:
                args.extend(value)
            elif parameter.kind is _KINDS.VAR_KEYWORD:
                kwargs.update(value)
            else:
                kwargs[name] = value
        return args, kwargs

    def handler(self) -> Callable[..., Any]:
        """The job handler a worker calls: decode the arguments, call the function, encode its result."""
        func: Callable[..., Any] = self.func
        if self.batch:
            return self._batch_handler()
        if self.is_async:

            async def run_task(job: JobExecution) -> Any:
                args, kwargs = self.arguments(job.configuration)
                return _result(await func(*args, **kwargs))

            return run_task

        def run_sync_task(job: SyncJobExecution) -> Any:
            args, kwargs = self.arguments(job.configuration)
            return _result(func(*args, **kwargs))

        return run_sync_task

    def _batch_handler(self) -> Callable[..., Any]:
        """A batch task's handler: the function gets the `JobBatch` itself; the items of a list it returns
        are stored as a task's return value is (an `Exception` item fails its job alone)."""
        func: Callable[..., Any] = self.func
        if self.is_async:

            async def run_batch_task(batch: JobBatch[JobExecution]) -> Any:
                return _batch_results(await func(batch))

            return run_batch_task

        def run_sync_batch_task(batch: JobBatch[SyncJobExecution]) -> Any:
            return _batch_results(func(batch))

        return run_sync_batch_task

    def _parameters(self) -> dict[str, _Parameter]:
        """Resolved on first use, not at decoration: annotations may name classes defined later."""
        if self._resolved is None:
            self._resolved = _parameters(self.func, self._signature)
        return self._resolved


@dataclass(frozen=True, slots=True)
class TaskOptions(Generic[P, R]):
    """A task with per-job options: `defer`, `defer_sync`, and `options` to change some of them."""

    task: Task[P, R]
    values: JobOptions = field(default_factory=lambda: JobOptions())
    connection: Connection | None = None

    def options(self, *, connection: Connection | None = None, **options: Unpack[JobOptions]) -> TaskOptions[P, R]:
        """These options with those given here changed (the keywords of `Task.options`)."""
        changed = self.task.options(connection=connection, **options)
        return replace(
            self,
            values=self.values | changed.values,
            connection=connection if connection is not None else self.connection,
        )

    async def defer(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        configuration = self.task.configuration(*args, **kwargs)
        connection = self.connection
        if connection is not None and not isinstance(connection, psycopg.AsyncConnection):
            raise TypeError("defer() needs an async psycopg connection; with a sync one, use defer_sync()")
        return await self.task.app.schedule(self.task.type, configuration, connection=connection, **self.values)

    def defer_sync(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        configuration = self.task.configuration(*args, **kwargs)
        connection = self.connection
        if connection is not None and not isinstance(connection, psycopg.Connection):
            raise TypeError("defer_sync() needs a sync psycopg connection; with an async one, use await defer()")
        return self.task.app.sync.schedule(self.task.type, configuration, connection=connection, **self.values)


def _result(value: Any) -> Any:
    """A task's return value as the job's JSON result (a dataclass or model becomes its JSON object)."""
    return None if value is None else encoding.to_json(value, what="the task's return value")


def _batch_results(value: Any) -> Any:
    """A batch task's return value: a list's items encoded as results (its exceptions kept as they are:
    each fails its job, as does an item that cannot be encoded); anything else is left for the worker to
    accept (None) or refuse."""
    if not isinstance(value, list | tuple):
        return value
    return [_batch_item(item) for item in value]


def _batch_item(item: Any) -> Any:
    if isinstance(item, Exception):
        return item
    try:
        return _result(item)
    except Exception as exc:  # this job's result cannot be stored: this job alone fails
        return exc


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func, include_extras=True)
    except NameError as exc:
        raise TypeError(
            f"task {func.__module__}.{func.__qualname__}: its annotations cannot be resolved ({exc}); define the "
            "types they name at module level"
        ) from None


def _parameters(func: Callable[..., Any], signature: inspect.Signature) -> dict[str, _Parameter]:
    hints = _hints(func)
    parameters: dict[str, _Parameter] = {}
    for name, parameter in signature.parameters.items():
        annotation = hints.get(name, Any)
        if parameter.kind is _KINDS.VAR_POSITIONAL:
            annotation = tuple[annotation, ...]  # type: ignore[valid-type]
        elif parameter.kind is _KINDS.VAR_KEYWORD:
            annotation = dict[str, annotation]  # type: ignore[valid-type]
        parameters[name] = _Parameter(name, parameter.kind, annotation)
    return parameters


def default_type(func: Callable[..., Any]) -> str:
    """The job type of an unnamed task: ``module.qualname``."""
    return f"{func.__module__}.{func.__qualname__}"
