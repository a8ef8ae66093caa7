"""Database calls that survive a restart, a killed backend or a network blip.

The worker never dies of a lost connection: it retries with capped exponential backoff, logging the
outage once when it starts and once when it ends, never a line per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import psycopg_pool

logger = logging.getLogger("jobbus.worker")
T = TypeVar("T")

#: Errors that mean "the connection or server went away", not "the statement is wrong".
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg_pool.PoolTimeout,
    psycopg.errors.AdminShutdown,
    psycopg.errors.CannotConnectNow,
    psycopg.errors.QueryCanceled,
)


#: Transient errors of one statement (deadlock, serialization, cancelled), not of the connection.
_STATEMENT_ERRORS = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.TransactionRollback,
    psycopg.errors.QueryCanceled,
)


class Backoff:
    """Capped exponential delays: 0.1 s doubling to `cap`."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.attempt = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.first * 2.0**self.attempt)
        self.attempt = min(self.attempt + 1, 32)
        return delay

    def reset(self) -> None:
        self.attempt = 0


class Outage:
    """Remembers whether a component is in an outage, so it logs the start and the end once each."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self.since is None:
            self.since = time.monotonic()
            what = "hit a transient database error" if isinstance(exc, _STATEMENT_ERRORS) else "lost the database"
            logger.warning(
                "%s %s (%s: %s); retrying with backoff",
                self.component,
                what,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                extra={"component": self.component},
            )

    def recovered(self) -> None:
        if self.since is not None:
            logger.warning(
                "%s recovered after %.1f s",
                self.component,
                time.monotonic() - self.since,
                extra={"component": self.component},
            )
            self.since = None


async def retrying(
    call: Callable[[], Awaitable[T]],
    outage: Outage,
    *,
    deadline: float | None = None,
    stop: asyncio.Event | None = None,
) -> T:
    """Run `call` until it succeeds; transient errors are retried until `deadline` (monotonic) passes."""
    backoff = Backoff()
    while True:
        try:
            result = await call()
        except TRANSIENT_ERRORS as exc:
            outage.failed(exc)
            delay = backoff.next_delay()
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            if stop is not None and stop.is_set():
                raise
            await asyncio.sleep(delay)
            continue
        outage.recovered()
        return result
