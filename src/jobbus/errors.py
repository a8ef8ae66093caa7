"""The exceptions jobbus raises (every one says what to do next), and the ones handlers raise."""

from __future__ import annotations

from datetime import timedelta


class JobbusError(Exception):
    """Base class of every error jobbus raises on purpose."""


class NonRetryableError(JobbusError):
    """Raised by a handler to fail its job at once, without further attempts."""


class LeaseLostError(JobbusError):
    """The caller no longer holds the job's current, unexpired lease: its write was rejected."""


class InvalidStateError(JobbusError):
    """The job does not exist or is not in a state that allows the operation."""


class SchemaError(JobbusError):
    """The database schema is missing or older than this code."""


class TransactionPoolerError(JobbusError):
    """The DSN goes through a transaction-mode pooler (PgBouncer's `pool_mode = transaction`) while the
    `transaction_pooling` setting is off: the prepared statements jobbus makes vanish between
    transactions. A configuration error (the CLI exits 78), never retried."""


class InvalidJobError(JobbusError, ValueError):
    """A job (or setting of one) was refused before anything was written."""


class CellRequiredError(JobbusError):
    """A call about one database's state was made on an App with cells: it belongs on `app.cells[NAME]`."""


class DatabaseUnavailableError(JobbusError):
    """The database could not be reached within `database_wait_seconds`.

    `written` says what became of the call: False when nothing was written, None when the connection was
    lost after the statement was sent and its outcome is unknown (a retry of a keyed `schedule` is
    always safe; jobbus already repeats statements that are safe to repeat before giving up).
    """

    def __init__(self, message: str, *, written: bool | None = False) -> None:
        super().__init__(message)
        self.written = written


class Snooze(Exception):
    """Raised by a handler: not ready yet, run again after `delay` (seconds or a timedelta).

    The job goes back to `queued` at now + delay; the attempt does not count and the checkpoint
    (`execution_data`) is kept. The job's history records the snooze. The worker checks the delay
    when it handles the snooze: one that is not 0 to a year fails the attempt with `InvalidJobError`.
    """

    def __init__(self, delay: float | timedelta) -> None:
        super().__init__(f"snoozed for {delay.total_seconds() if isinstance(delay, timedelta) else delay} s")
        self.delay = delay


class MigrationLockError(JobbusError):
    """A migration could not take the locks it needs within its bounded wait; nothing of it was applied.

    Another session held them the whole time (`holders` says which, when the server could tell): run
    `jobbus migrate` again once it has ended.
    """

    def __init__(self, message: str, *, table: str, mode: str, holders: str) -> None:
        super().__init__(message)
        self.table = table
        self.mode = mode
        self.holders = holders
