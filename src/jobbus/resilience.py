"""Which database errors jobbus rides out, and how it waits them out (workers and producers alike).

Every error of a database call is classified once, by SQLSTATE class rather than by Python class
(psycopg files "index row too large" under OperationalError, and a read-only transaction under
InternalError):

- transient: the server or the connection is away or busy, or the statement lost a race. A worker
  retries with capped exponential backoff (a producer within `database_wait_seconds`); the outage
  is logged when it starts and when it ends, never per attempt. Connection failures, admin or crash
  shutdown, "cannot connect now", too many connections, out of memory or disk, serialization
  failures and deadlocks, statement and lock timeouts, a read-only transaction (a demoted primary,
  or a failover behind stale DNS), an idle session killed.
- data: the database refuses this row (a value out of range, bad text, a constraint). Isolated to
  that row: the rest of a batch is written.
- fatal: anything else (a missing table or function, a privilege revoked, an internal error). The
  worker stops claiming, gives back what it holds within a bounded time and exits 70.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from jobbus.errors import DatabaseUnavailableError, TransactionPoolerError
from jobbus.settings import redact

logger = logging.getLogger("jobbus.worker")
T = TypeVar("T")


class ErrorKind(enum.Enum):
    TRANSIENT = "transient"
    DATA = "data"
    FATAL = "fatal"


#: SQLSTATEs (or their two-character classes) that a worker retries.
_TRANSIENT_STATES = frozenset(
    {
        "08",  # connection exception
        "40",  # transaction rollback: serialization failure, deadlock
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57P01",  # admin shutdown
        "57P02",  # crash shutdown
        "57P03",  # cannot connect now (starting up, recovering)
        "57P05",  # idle session timeout
        "57014",  # query canceled (statement_timeout, pg_cancel_backend)
        "55P03",  # lock not available (lock_timeout)
        "55006",  # object in use
        "25006",  # read-only SQL transaction: a demoted primary, a failover behind stale DNS
        "25P03",  # idle-in-transaction session timeout
        "58030",  # I/O error
    }
)
#: Classes whose errors belong to the row being written.
_DATA_CLASSES = frozenset({"22", "23", "54"})


def classify(exc: BaseException) -> ErrorKind:
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return ErrorKind.TRANSIENT
    if not isinstance(exc, psycopg.Error):
        return ErrorKind.FATAL
    state = exc.sqlstate
    if state is None:  # raised by the client: the connection broke or could not be made
        return ErrorKind.TRANSIENT if isinstance(exc, psycopg.OperationalError) else ErrorKind.FATAL
    if state in _TRANSIENT_STATES or state[:2] in _TRANSIENT_STATES:
        return ErrorKind.TRANSIENT
    if state[:2] in _DATA_CLASSES:
        return ErrorKind.DATA
    return ErrorKind.FATAL


def is_transient(exc: BaseException) -> bool:
    return classify(exc) is ErrorKind.TRANSIENT


#: A prepared statement that does not exist (26000) or exists already (42P05) on a connection that
#: made (or never made) it: what psycopg's prepared statements meet when each transaction may run on
#: another server connection, behind a transaction-mode pooler.
_POOLER_STATES = frozenset({"26000", "42P05"})


def pooler_misconfiguration(exc: BaseException, transaction_pooling: bool) -> TransactionPoolerError | None:
    """The one-line configuration error that `exc` means, when it shows a transaction-mode pooler in
    front of a client whose `transaction_pooling` is off; else None."""
    if transaction_pooling or not isinstance(exc, psycopg.Error) or exc.sqlstate not in _POOLER_STATES:
        return None
    return TransactionPoolerError(
        f"the DSN goes through a transaction-mode pooler (such as PgBouncer with pool_mode = transaction): "
        f"{first_line(exc)}; set transaction_pooling=True (JOBBUS_TRANSACTION_POOLING=true) for a DSN through "
        "such a pooler, and listen_dsn to the server itself for LISTEN"
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
            connection_lost = isinstance(exc, psycopg_pool.PoolTimeout | psycopg.InterfaceError) or (
                isinstance(exc, psycopg.Error) and (exc.sqlstate is None or exc.sqlstate[:2] in ("08", "57"))
            )
            what = "lost the database" if connection_lost else "hit a transient database error"
            logger.warning(
                "%s %s (%s: %s); retrying with backoff",
                self.component,
                what,
                type(exc).__name__,
                first_line(exc),
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


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


async def retrying(call: Callable[[], Awaitable[T]], outage: Outage, *, deadline: float | None = None) -> T:
    """Run `call` until it succeeds; transient errors are retried until `deadline` (monotonic) passes."""
    backoff = Backoff()
    while True:
        try:
            result = await call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            outage.failed(exc)
            delay = backoff.next_delay()
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            continue
        outage.recovered()
        return result


#: A pool is given at least this long to make its first connection, whatever `database_wait_seconds`.
OPEN_MIN_SECONDS = 1.0
#: After a pool could not connect, one more connection is tried for this long, to name the reason.
PROBE_SECONDS = 2


async def open_pool(pool: psycopg_pool.AsyncConnectionPool[Any], dsn: str, seconds: float) -> None:
    """Open `pool` (of `dsn`), waiting at most `seconds` (`database_wait_seconds`) for its first
    connections; then `DatabaseUnavailableError` naming why it could not connect (the pool is closed)."""
    try:
        await pool.open(wait=True, timeout=max(seconds, OPEN_MIN_SECONDS))
    except psycopg_pool.PoolTimeout:
        reason = None
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=PROBE_SECONDS)
        except Exception as exc:
            reason = exc
        else:
            await conn.close()
        raise _could_not_connect(seconds, reason) from reason


def open_pool_sync(pool: psycopg_pool.ConnectionPool[Any], dsn: str, seconds: float) -> None:
    """The blocking twin of `open_pool`."""
    try:
        pool.open(wait=True, timeout=max(seconds, OPEN_MIN_SECONDS))
    except psycopg_pool.PoolTimeout:
        reason = None
        try:
            psycopg.Connection.connect(dsn, connect_timeout=PROBE_SECONDS).close()
        except Exception as exc:
            reason = exc
        raise _could_not_connect(seconds, reason) from reason


def _could_not_connect(seconds: float, reason: BaseException | None) -> DatabaseUnavailableError:
    why = f" ({type(reason).__name__}: {redact(first_line(reason))})" if reason is not None else ""
    return DatabaseUnavailableError(
        f"the database is unavailable: no connection within database_wait_seconds ({seconds:g} s){why}; "
        "check that the server is up and reachable, or wait longer with a larger database_wait_seconds"
    )
