"""Lifecycle events, delivered in-process after the state change is committed.

A listener that raises is logged and never changes the job. Events are not an outbox: a process that
dies between the commit and the listener call never delivers that event.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from jobbus.models import JobStatus

logger = logging.getLogger("jobbus.events")


@dataclass(frozen=True, slots=True)
class JobEvent:
    job_id: uuid.UUID
    type: str
    queue: str


@dataclass(frozen=True, slots=True)
class JobScheduled(JobEvent):
    pass


@dataclass(frozen=True, slots=True)
class JobStarted(JobEvent):
    attempt: int


@dataclass(frozen=True, slots=True)
class JobCompleted(JobEvent):
    attempt: int
    result: Any


@dataclass(frozen=True, slots=True)
class JobRetried(JobEvent):
    attempt: int
    error: str
    delay_seconds: float


@dataclass(frozen=True, slots=True)
class JobFailed(JobEvent):
    attempt: int
    error: str


@dataclass(frozen=True, slots=True)
class JobCancelled(JobEvent):
    previous_status: JobStatus


E = TypeVar("E", bound=JobEvent)
Listener = Callable[[Any], Awaitable[None] | None]


class EventHub:
    """Listeners by event class; sync listeners are called inline, async ones awaited."""

    def __init__(self) -> None:
        self._listeners: dict[type[JobEvent], list[Listener]] = {}
        #: Whether any listener is registered: until one is, the worker builds no event per job.
        self.active = False

    def on(self, event_type: type[E]) -> Callable[[Callable[[E], Any]], Callable[[E], Any]]:
        if not (isinstance(event_type, type) and issubclass(event_type, JobEvent)):
            raise TypeError(f"app.on() takes a jobbus event class such as jobbus.JobCompleted, got {event_type!r}")

        def register(listener: Callable[[E], Any]) -> Callable[[E], Any]:
            self._listeners.setdefault(event_type, []).append(listener)
            self.active = True
            return listener

        return register

    def __bool__(self) -> bool:
        return self.active

    def _targets(self, event: JobEvent) -> list[Listener]:
        return [
            listener
            for event_type, listeners in self._listeners.items()
            if isinstance(event, event_type)
            for listener in listeners
        ]

    async def emit(self, event: JobEvent) -> None:
        for listener in self._targets(event):
            try:
                outcome = listener(event)
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError:
                raise
            except Exception:
                _log_failure(listener, event)

    def emit_sync(self, event: JobEvent) -> None:
        """From blocking code: async listeners run to completion on a private loop."""
        for listener in self._targets(event):
            try:
                outcome = listener(event)
                if inspect.isawaitable(outcome):
                    asyncio.run(_await(outcome))
            except Exception:
                _log_failure(listener, event)


def _log_failure(listener: Listener, event: JobEvent) -> None:
    logger.exception(
        "event listener %r failed for %s", listener, type(event).__name__, extra={"job_id": str(event.job_id)}
    )


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable
