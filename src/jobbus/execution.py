"""What a handler sees: `JobExecution` (async handlers) and `SyncJobExecution` (sync handlers).

Every write is fenced by the attempt's lease token: once the lease is gone (expired, re-claimed, or
released at shutdown) the write is rejected and `LeaseLostError` is raised.

Why the worker wants an attempt to stop lives in one place, `AttemptSignals`: the worker sets reasons
on it, the handler reads them through `cancellation_requested` and `lease_lost`.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from jobbus.errors import LeaseLostError
from jobbus.models import ClaimedJob
from jobbus.requests import json_text
from jobbus.store import Statement

if TYPE_CHECKING:
    from jobbus.store import JobStore

T = TypeVar("T")
Runner = Callable[[Statement[Any]], Awaitable[Any]]


class StopReason(enum.Enum):
    """Why an attempt should stop before its handler is done."""

    #: `cancel()` was called: the attempt ends as `cancelled`, whatever the handler does next.
    CANCELLED = "cancelled"
    #: The worker is shutting down: a handler that saw this and returned gives the job back.
    SHUTDOWN = "shutdown"
    #: The attempt ran past its timeout: it fails (and is retried) with "timed out".
    TIMEOUT = "timed out"
    #: The worker could not reach the database for long enough that the job may be recovered by
    #: another worker at any moment: nothing the handler does is written; the job is given up.
    FENCED = "fenced"
    #: The lease expired or was taken over: nothing more of this attempt is written.
    LEASE_LOST = "lease lost"


_LOSING = frozenset({StopReason.FENCED, StopReason.LEASE_LOST})


class AttemptSignals:
    """The stop reasons of one attempt: set by the worker, read by the handler.

    Plain attribute updates under the GIL, so a sync handler's thread reads them safely.
    """

    __slots__ = ("_closed", "_observed", "_reasons")

    def __init__(self, *, cancelled: bool = False) -> None:
        self._reasons: frozenset[StopReason] = frozenset({StopReason.CANCELLED} if cancelled else ())
        self._observed = False
        self._closed = False

    def request(self, reason: StopReason) -> bool:
        """Add a reason; returns True if it is new."""
        if reason in self._reasons:
            return False
        self._reasons = self._reasons | {reason}
        return True

    def __contains__(self, reason: StopReason) -> bool:
        return reason in self._reasons

    @property
    def reasons(self) -> frozenset[StopReason]:
        return self._reasons

    @property
    def requested(self) -> bool:
        return bool(self._reasons)

    def observe(self) -> bool:
        """What the handler reads: remembers that it saw a stop request (so returning then means it stopped)."""
        if self._reasons:
            self._observed = True
            return True
        return False

    @property
    def observed(self) -> bool:
        return self._observed

    @property
    def lease_lost(self) -> bool:
        return not self._reasons.isdisjoint(_LOSING)

    def close(self) -> None:
        """The attempt is over: later fenced writes are refused without asking the database."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


class JobExecution:
    """One attempt of one job, as its async handler sees it."""

    def __init__(
        self,
        claimed: ClaimedJob,
        store: JobStore,
        run: Runner,
        lease_seconds: float,
        max_payload_bytes: int,
        signals: AttemptSignals | None = None,
    ) -> None:
        self._claimed = claimed
        self._max_payload_bytes = max_payload_bytes
        self._store = store
        self._run = run
        self._lease_seconds = lease_seconds
        self._execution_data: dict[str, Any] = dict(claimed.execution_data)
        self._configuration = MappingProxyType(dict(claimed.configuration_data or {}))
        self._signals = signals if signals is not None else AttemptSignals(cancelled=claimed.cancellation_requested)
        self.scope: Any = None

    # -- identity ----------------------------------------------------------------------------------
    @property
    def id(self) -> uuid.UUID:
        return self._claimed.id

    @property
    def type(self) -> str:
        return self._claimed.type

    @property
    def queue(self) -> str:
        return self._claimed.queue

    @property
    def name(self) -> str | None:
        return self._claimed.name

    @property
    def group_id(self) -> uuid.UUID | None:
        return self._claimed.group_id

    @property
    def attempt(self) -> int:
        """1-based number of this attempt."""
        return self._claimed.attempts

    @property
    def max_attempts(self) -> int:
        return self._claimed.max_attempts

    @property
    def lease_token(self) -> uuid.UUID:
        return self._claimed.lease_token

    @property
    def created_at(self) -> datetime:
        """When the job was scheduled (database clock)."""
        return self._claimed.created_at

    @property
    def available_at(self) -> datetime:
        """When the job became available to run: `created_at` or its delay, or the last retry's backoff."""
        return self._claimed.available_at

    @property
    def configuration(self) -> Mapping[str, Any]:
        """The job's input, read-only: configuration never changes after scheduling."""
        return self._configuration

    @property
    def execution_data(self) -> dict[str, Any]:
        """The latest checkpoint (a copy: change it through `checkpoint`)."""
        return dict(self._execution_data)

    # -- cancellation ------------------------------------------------------------------------------
    @property
    def cancellation_requested(self) -> bool:
        """True once the job was cancelled, the worker is stopping, the attempt timed out, or the lease
        is lost. Return (or raise) soon: what happens next depends on why (docs/worker.md)."""
        return self._signals.observe()

    @property
    def lease_lost(self) -> bool:
        """True once this attempt can no longer write anything: another attempt may own the job."""
        return self._signals.lease_lost

    # -- fenced writes -----------------------------------------------------------------------------
    def _refuse(self, what: str) -> LeaseLostError:
        if self._signals.closed and not self._signals.lease_lost:
            return LeaseLostError(f"job {self.id}: {what} rejected, attempt {self.attempt} is over")
        return LeaseLostError(f"job {self.id}: {what} rejected, the lease of attempt {self.attempt} is lost")

    async def _fenced(self, statement: Statement[bool | None], what: str) -> None:
        if self._signals.lease_lost or self._signals.closed:
            raise self._refuse(what)
        flag = await self._run(statement)
        if flag is None:
            self._signals.request(StopReason.LEASE_LOST)
            raise self._refuse(what)
        if flag:
            self._signals.request(StopReason.CANCELLED)

    async def checkpoint(self, data: Mapping[str, Any]) -> None:
        """Replace the checkpoint with `data` (a JSON object); durable when this returns."""
        if not isinstance(data, Mapping):
            raise TypeError(f"checkpoint data must be a JSON object (a dict), got {type(data).__name__}")
        text = json_text("checkpoint data", dict(data), self._max_payload_bytes)
        await self._fenced(self._store.checkpoint_job(self.id, self.lease_token, text), "checkpoint")
        self._execution_data = dict(data)

    async def progress(self, current: float, total: float | None = None) -> None:
        """Record progress beside the checkpoint (not inside it)."""
        for value in (current, total):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise TypeError(f"progress values must be numbers, got {value!r}")
        statement = self._store.progress_job(self.id, self.lease_token, float(current), _opt_float(total))
        await self._fenced(statement, "progress")

    async def heartbeat(self) -> None:
        """Extend the lease now (the worker also does this for every job in the background)."""
        statement = self._store.heartbeat_job(self.id, self.lease_token, self._lease_seconds)
        await self._fenced(statement, "heartbeat")


class SyncJobExecution:
    """The same attempt for a sync handler running in a worker thread: the methods block."""

    def __init__(self, execution: JobExecution, loop: asyncio.AbstractEventLoop) -> None:
        self._execution = execution
        self._loop = loop

    @property
    def id(self) -> uuid.UUID:
        return self._execution.id

    @property
    def type(self) -> str:
        return self._execution.type

    @property
    def queue(self) -> str:
        return self._execution.queue

    @property
    def name(self) -> str | None:
        return self._execution.name

    @property
    def group_id(self) -> uuid.UUID | None:
        return self._execution.group_id

    @property
    def attempt(self) -> int:
        return self._execution.attempt

    @property
    def max_attempts(self) -> int:
        return self._execution.max_attempts

    @property
    def created_at(self) -> datetime:
        return self._execution.created_at

    @property
    def available_at(self) -> datetime:
        return self._execution.available_at

    @property
    def scope(self) -> Any:
        return self._execution.scope

    @property
    def cancellation_requested(self) -> bool:
        return self._execution.cancellation_requested

    @property
    def lease_lost(self) -> bool:
        return self._execution.lease_lost

    @property
    def execution_data(self) -> dict[str, Any]:
        return self._execution.execution_data

    @property
    def configuration(self) -> Mapping[str, Any]:
        return self._execution.configuration

    def _wait(self, awaitable: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self._loop).result()

    def checkpoint(self, data: Mapping[str, Any]) -> None:
        self._wait(self._execution.checkpoint(data))

    def progress(self, current: float, total: float | None = None) -> None:
        self._wait(self._execution.progress(current, total))

    def heartbeat(self) -> None:
        self._wait(self._execution.heartbeat())


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


# -- the running job ------------------------------------------------------------------------------

#: The attempt whose handler is running in this context: each job runs in its own asyncio task (async
#: handlers) or has its thread's context set for the call (sync handlers), so concurrent jobs never see
#: each other's.
_CURRENT: contextvars.ContextVar[JobExecution | SyncJobExecution] = contextvars.ContextVar("jobbus_current_job")


def current_job() -> JobExecution:
    """The `JobExecution` of the async handler (or typed task) running now, from any code it calls.

    Raises `RuntimeError` outside a job, and in a sync handler, which has `current_sync_job()`.
    """
    job = _CURRENT.get(None)
    if isinstance(job, JobExecution):
        return job
    if job is None:
        raise RuntimeError("current_job() is called outside a job: only code run by a worker's handler has one")
    raise RuntimeError("current_job() is called in a sync handler: use jobbus.current_sync_job(), its blocking twin")


def current_sync_job() -> SyncJobExecution:
    """The `SyncJobExecution` of the sync handler (or typed task) running now; see `current_job()`."""
    job = _CURRENT.get(None)
    if isinstance(job, SyncJobExecution):
        return job
    if job is None:
        raise RuntimeError("current_sync_job() is called outside a job: only code run by a worker's handler has one")
    raise RuntimeError("current_sync_job() is called in an async handler: use jobbus.current_job()")


def enter_job(job: JobExecution | SyncJobExecution) -> contextvars.Token[JobExecution | SyncJobExecution]:
    """Make `job` the current one in this context (the worker's executor, and `drain`)."""
    return _CURRENT.set(job)


def leave_job(token: contextvars.Token[JobExecution | SyncJobExecution]) -> None:
    _CURRENT.reset(token)
