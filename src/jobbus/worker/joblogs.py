"""Job logs: what a handler logs during an attempt is kept with it (SPEC 22, docs/observability.md).

One `logging.Handler` on the root logger while a worker runs. A record is kept with an attempt when it
was made through that attempt's `job.logger`, or in a context where an attempt runs (its handler's
task or thread, a task it started, a batch handler's call: every job of the call keeps it). Records
of jobbus's own loggers are never kept, and nothing is taken from the application's handlers: the
record goes on to them as before. A worker whose handlers log nothing pays nothing per job here: the
handler is only called for records that are made, and the attempt's log is made at its first line.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from jobbus.execution import JobExecution, logging_attempts
from jobbus.joblog import JOB_LOGGER, MAX_LINE_BYTES
from jobbus.redaction import redact_error
from jobbus.worker.outcomes import error_text, traceback_text


class JobLogCapture(logging.Handler):
    """Keeps each record made by or for a running attempt with that attempt."""

    def handle(self, record: logging.LogRecord) -> bool:
        """Without the handler's lock: formatting a line (masking included) does not hold up other
        threads' records; only adding it to an attempt's log takes a short lock."""
        last_resort = logging.lastResort
        if last_resort is not None and record.levelno >= last_resort.level and self._alone(record):
            # Python prints a record no handler takes (`logging.lastResort`); this handler alone must
            # not take that from an application that configured no logging.
            last_resort.handle(record)
        attempts = _attempts_of(record)
        if not attempts:
            return False
        try:
            at, level, message = line_of(record)
            for attempt in attempts:
                attempt._attempt_log().add(at, level, message)
        except Exception:
            self.handleError(record)
        return True

    def _alone(self, record: logging.LogRecord) -> bool:
        """Whether no other handler is on the record's way to the root (as `Logger.callHandlers` looks)."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return False
            if not logger.propagate:
                return True
            logger = logger.parent
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


def _attempts_of(record: logging.LogRecord) -> Sequence[JobExecution]:
    attempt = record.__dict__.get("jobbus_attempt")
    if isinstance(attempt, JobExecution):  # job.logger: its own attempt, from wherever it is called
        return (attempt,)
    name = record.name
    if name.startswith("jobbus") and (name == "jobbus" or name[6] == ".") and not _is_job_logger(name):
        return ()  # the library's own lines (the worker's, the store's, the producer's) are never a job's
    return logging_attempts()


def _is_job_logger(name: str) -> bool:
    return name == JOB_LOGGER or name.startswith(JOB_LOGGER + ".")


def line_of(record: logging.LogRecord) -> tuple[str, str, str]:
    """The record as a stored line: its time (ISO 8601, UTC), level name and message, the message
    masked and cut to `MAX_LINE_BYTES` (its head), then the exception's traceback and the stack
    when the record has them, each masked and cut to `MAX_LINE_BYTES` (its tail). Cut before masked,
    so a record of any size costs what its kept part does."""
    try:
        message = record.getMessage()
    except Exception as exc:  # wrong arguments for its format, a hostile __str__
        message = error_text(exc, "the record's message could not be formatted: ")
    parts = [redact_error(message, MAX_LINE_BYTES)]
    exc_info = record.exc_info
    if exc_info and exc_info[1] is not None:
        parts.append(redact_error(traceback_text(exc_info[1]).rstrip("\n"), MAX_LINE_BYTES, keep="tail"))
    elif record.exc_text:
        parts.append(redact_error(record.exc_text, MAX_LINE_BYTES, keep="tail"))
    if record.stack_info:
        parts.append(redact_error(record.stack_info, MAX_LINE_BYTES, keep="tail"))
    at = datetime.fromtimestamp(record.created, UTC).isoformat()
    return at, redact_error(str(record.levelname), 64), "\n".join(parts)


_CAPTURE = JobLogCapture()
_INSTALLED = threading.Lock()
_users = 0


@contextmanager
def capturing_job_logs() -> Iterator[None]:
    """While a worker serves: the capture is on the root logger once, however many workers a process
    runs, and taken off when the last one stops."""
    global _users
    with _INSTALLED:
        if _users == 0:
            logging.getLogger().addHandler(_CAPTURE)
        _users += 1
    try:
        yield
    finally:
        with _INSTALLED:
            _users -= 1
            if _users == 0:
                logging.getLogger().removeHandler(_CAPTURE)
