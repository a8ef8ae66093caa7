"""What a handler sees: `JobExecution` (async handlers) and `SyncJobExecution` (sync handlers).

Every write is fenced by the attempt's lease token: once the lease is gone (expired, re-claimed, or
released at shutdown) the write is rejected and `LeaseLostError` is raised.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
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


class JobExecution:
    """One attempt of one job, as its async handler sees it."""

    def __init__(
        self, claimed: ClaimedJob, store: JobStore, run: Runner, lease_seconds: float, max_payload_bytes: int
    ) -> None:
        self._claimed = claimed
        self._max_payload_bytes = max_payload_bytes
        self._store = store
        self._run = run
        self._lease_seconds = lease_seconds
        self._execution_data: dict[str, Any] = dict(claimed.execution_data)
        self._configuration = MappingProxyType(dict(claimed.configuration_data))
        self._cancel_requested_by_user = claimed.cancellation_requested
        self._cancel_requested_by_worker = False
        self._lease_lost = False
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
        """True once the job was cancelled, the worker is shutting down, or the lease was lost."""
        return self._cancel_requested_by_user or self._cancel_requested_by_worker or self._lease_lost

    @property
    def cancelled_by_user(self) -> bool:
        return self._cancel_requested_by_user

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost

    def _note_cancellation(self, requested: bool | None) -> None:
        if requested is None:
            self._lease_lost = True
        elif requested:
            self._cancel_requested_by_user = True

    def _request_stop(self) -> None:
        self._cancel_requested_by_worker = True

    def _mark_lease_lost(self) -> None:
        self._lease_lost = True

    # -- fenced writes -----------------------------------------------------------------------------
    async def _fenced(self, statement: Statement[bool | None], what: str) -> None:
        if self._lease_lost:
            raise LeaseLostError(f"job {self.id}: {what} rejected, the lease of attempt {self.attempt} is lost")
        flag = await self._run(statement)
        self._note_cancellation(flag)
        if flag is None:
            raise LeaseLostError(f"job {self.id}: {what} rejected, the lease of attempt {self.attempt} is lost")

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
    def scope(self) -> Any:
        return self._execution.scope

    @property
    def cancellation_requested(self) -> bool:
        return self._execution.cancellation_requested

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
