"""The worker's two connection pools, and how each kind of its statements runs on them.

The worker's own pool serves claims, outcomes, renewals, control and maintenance; the handlers' pool
serves the calls a handler makes (checkpoint, progress, heartbeat, steps, durable waits, spawns), so
many handlers writing at once never queue in front of the worker's own statements. Both are separate
from the App's pool, which handlers and job scopes may hold for as long as they like.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobbus.errors import LeaseLostError, TransactionPoolerError
from jobbus.resilience import Backoff, Outage, first_line, is_transient, open_pool, pooler_misconfiguration
from jobbus.settings import Settings
from jobbus.store import Statement, run_async
from jobbus.store.statements import configure_async
from jobbus.worker.attempt import Attempt

T = TypeVar("T")

#: Connections of the worker's own pool.
SYSTEM_POOL_SIZE = 4
#: How long a worker statement waits for a connection of the worker's pool (psycopg_pool's default).
CONNECTION_WAIT_SECONDS = 30.0
#: While that wait lasts (an outage), a claim or control read looks this often whether the worker was
#: asked to stop: nothing was sent yet, so it gives up and the worker stops at once.
STOP_CHECK_SECONDS = 0.5
#: Closing a pool gets at least this long, even once the exit's housekeeping deadline has passed.
POOL_CLOSE_SECONDS = 0.5


class Pools:
    def __init__(
        self,
        settings: Settings,
        *,
        stopping: Callable[[], bool],
        on_misconfigured: Callable[[TransactionPoolerError], None],
    ) -> None:
        self.settings = settings
        self._stopping = stopping
        self._on_misconfigured = on_misconfigured
        self._pool: AsyncConnectionPool[Any] | None = None
        self._handler_pool: AsyncConnectionPool[Any] | None = None
        self._handler_outage = Outage("handler calls")

    @property
    def max_connections(self) -> int:
        """The most connections both pools hold at once."""
        return SYSTEM_POOL_SIZE + self.settings.pool_max_size

    async def open(self, dsn: str) -> None:
        """The worker's pool waits for the database (`database_wait_seconds`); the handlers' opens empty."""
        self._pool = await self._open(dsn, "jobbus-worker", 1, SYSTEM_POOL_SIZE)
        self._handler_pool = await self._open(dsn, "jobbus-handlers", 0, self.settings.pool_max_size)

    async def close(self, seconds_left: Callable[[], float]) -> None:
        """Close each pool within what `seconds_left()` says is left of the exit (POOL_CLOSE_SECONDS at least)."""
        for pool in (self._pool, self._handler_pool):
            if pool is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pool.close(), max(seconds_left(), POOL_CLOSE_SECONDS))

    async def _open(self, dsn: str, name: str, min_size: int, max_size: int) -> AsyncConnectionPool[Any]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=self.settings.connection_kwargs,
            configure=configure_async,
            open=False,
            name=f"{name}-{self.settings.schema}",
        )
        if min_size > 0:
            await open_pool(pool, dsn, self.settings.database_wait_seconds)
        else:
            await pool.open(wait=False)
        return pool

    async def run(self, statement: Statement[T]) -> T:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            return await self._execute(conn, statement)

    async def _execute(self, conn: AsyncConnection[Any], statement: Statement[T]) -> T:
        """Run `statement`; an error that shows a transaction-mode pooler while `transaction_pooling` is off
        is reported (the worker stops with one line) and raised as `TransactionPoolerError`, wherever
        in the worker it was met, so no part retries it or logs it as an internal error."""
        try:
            return await run_async(conn, statement)
        except psycopg.Error as exc:
            misconfigured = pooler_misconfiguration(exc, self.settings.transaction_pooling)
            if misconfigured is None:
                raise
            self._on_misconfigured(misconfigured)
            raise misconfigured from exc

    async def run_unless_stopping(self, statement: Statement[T]) -> T:
        """Claims and control reads, which a stopping worker no longer needs: while the pool has no
        connection to give (an outage), the wait for one ends once a stop is asked for (PoolTimeout,
        nothing sent), so SIGTERM is not held up by `CONNECTION_WAIT_SECONDS`."""
        assert self._pool is not None
        deadline = time.monotonic() + CONNECTION_WAIT_SECONDS
        while True:
            try:
                async with self._pool.connection(timeout=STOP_CHECK_SECONDS) as conn:
                    return await self._execute(conn, statement)
            except PoolTimeout:
                if self._stopping() or time.monotonic() >= deadline:
                    raise

    async def run_waiting(self, statement: Statement[T], seconds: float) -> T:
        """`statement`, waiting `seconds` at most for a connection (then PoolTimeout, nothing sent)."""
        assert self._pool is not None
        async with self._pool.connection(timeout=seconds) as conn:
            return await self._execute(conn, statement)

    async def run_for_handler(self, attempt_ref: weakref.ref[Attempt], statement: Statement[T]) -> T:
        """A call a handler makes for the attempt, on the handlers' pool. A dropped connection does not fail
        it: see `_retry_for_handler`."""
        assert self._handler_pool is not None
        try:
            async with self._handler_pool.connection() as conn:
                return await self._execute(conn, statement)
        except Exception as exc:
            if not is_transient(exc):
                raise
            return await self._retry_for_handler(attempt_ref, statement, exc)

    async def _retry_for_handler(self, attempt_ref: weakref.ref[Attempt], statement: Statement[T], exc: Exception) -> T:
        """Run a handler's call again, with backoff, on connections checked first, while the attempt's
        lease holds: every such call is safe to run twice (one that committed before its connection
        dropped answers the same again; a durable wait tells that it parked, see `JobExecution`).
        Once the lease is surely gone, or the worker fenced, or the attempt over: `LeaseLostError`,
        as a fenced write would say (its outcome is then not written; the job is recovered)."""
        pool = self._handler_pool
        assert pool is not None
        attempt = attempt_ref()
        if attempt is None:  # a call made through an execution kept past its attempt's end
            raise LeaseLostError("a handler's call lost its database connection after its attempt ended") from exc
        backoff = Backoff()
        while True:
            self._handler_outage.failed(exc)
            delay = backoff.next_delay()
            signals = attempt.signals
            if signals.lease_lost or signals.closed or time.monotonic() + delay > attempt.lease_deadline:
                raise LeaseLostError(
                    f"job {attempt.id}: attempt {attempt.claimed.attempts} lost its database connection "
                    f"({type(exc).__name__}: {first_line(exc)}) and its lease ended before the call got through"
                ) from exc
            await asyncio.sleep(delay)
            with contextlib.suppress(Exception):
                await pool.check()  # drop every idle connection the same outage broke, not one per try
            try:  # waiting for a new connection no longer than the lease lasts
                async with pool.connection(timeout=max(0.1, attempt.lease_deadline - time.monotonic())) as conn:
                    result = await self._execute(conn, statement)
            except Exception as again:
                if not is_transient(again):
                    raise
                exc = again
                continue
            self._handler_outage.recovered()
            return result
