"""How the end of an attempt becomes its outcome: completed, retried, failed, cancelled or given back.

The rules, in order (docs/worker.md):
1. A lost lease writes nothing: another attempt may own the job.
2. A cancellation asked for by a user ends as `cancelled`, whatever the handler did next.
3. A cancellation the worker itself started (shutdown, timeout) gives the job back or fails it with
   "timed out"; a fenced attempt (the worker lost the database) gives the job up, counted.
4. A normal return is `completed` with its result, unless the handler saw a shutdown request and
   returned: then it stopped early and the job is given back.
5. Any other exception, every `BaseException` included (a `CancelledError` the worker did not cause,
   `KeyboardInterrupt`, `SystemExit`), is a failed attempt: retried with backoff, or failed for good
   when it is `NonRetryableError` or the last attempt.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from jobbus.durations import seconds_or_none
from jobbus.encryption import keyring_of
from jobbus.errors import InvalidJobError, LeaseLostError, NonRetryableError, Snooze
from jobbus.events import EventHub, JobCancelled, JobCompleted, JobEvent, JobFailed, JobRetried
from jobbus.execution import JobParked, StopReason
from jobbus.models import JobStatus
from jobbus.redaction import SECRET_SPAN, redact_error
from jobbus.requests import json_text, sealed_within
from jobbus.retry import backoff_seconds
from jobbus.settings import Settings
from jobbus.store import Outcome
from jobbus.worker.attempt import Attempt

logger = logging.getLogger("jobbus.worker")

#: last_error, and each history entry's error, keep at most this many bytes (UTF-8), their head: a
#: hostile exception message cannot bloat the row.
MAX_ERROR_BYTES = 4 * 1024
#: A stored traceback keeps at most this many bytes (UTF-8), its tail: where the exception was raised.
MAX_TRACEBACK_BYTES = 16 * 1024


#: How an attempt ended, as metrics count it (`jobbus_jobs_finished_total{outcome}`).
OUTCOME_KINDS = ("completed", "retried", "failed", "cancelled", "released", "snoozed", "timed_out", "waiting")


@dataclass(slots=True)
class Decision:
    """What to write for one attempt (None: nothing, the lease is gone), what to announce after, and
    which of `OUTCOME_KINDS` it is. Made once per attempt: not frozen, whose `__init__` costs three times
    a plain one's."""

    outcome: Outcome | None
    event: JobEvent | None = None
    kind: str = "lost"


NOTHING = Decision(None)


#: Before an exception is formatted, each message of its chain keeps this many characters of its head
#: and as many of its tail: more than a stored error or traceback keeps, with the margin that masking
#: reads beyond a cut (`redaction.SECRET_SPAN`). So formatting costs the same for any message's length.
MESSAGE_KEEP = MAX_TRACEBACK_BYTES + SECRET_SPAN


def error_text(exc: BaseException, prefix: str = "", suffix: str = "") -> str:
    """One storable line: the exception's last line, secrets masked, bounded (`storable_text`)."""
    try:
        line = list(_report(exc, frames=False).format_exception_only())[-1].strip()
    except Exception:  # a hostile __str__
        line = type(exc).__qualname__
    return storable_text(prefix + line + suffix)


def storable_text(text: str) -> str:
    """An error as `last_error` and the history store it: secrets masked, no NUL, valid UTF-8, at most
    `MAX_ERROR_BYTES` with its head kept (`redaction.redact_error`: cut first, so a message of any
    length costs what 4 KiB does)."""
    return redact_error(text, MAX_ERROR_BYTES)


def traceback_text(exc: BaseException) -> str:
    """The attempt's formatted traceback for its history: chained exceptions included, secrets masked,
    storable, at most `MAX_TRACEBACK_BYTES` with its tail kept (cut at a line start, after a line that
    says it was cut). Only failing attempts pay for it, and a long message no more than 40 KiB of it
    does: with this and `error_text`, a failure's whole path on the event loop took 1.2 ms for a plain
    message and 3.6-3.9 ms for a hostile one (`a://b:` over and over, compact JSON full of URLs),
    of 300 KiB as of 10 MiB (`python -m bench.error_path`, docs/security.md)."""
    try:
        text = "".join(_report(exc, frames=True).format())
    except Exception:  # a hostile __str__ or __repr__ that even traceback's guards do not catch
        text = f"{type(exc).__qualname__} (its traceback could not be formatted)\n"
    return redact_error(text, MAX_TRACEBACK_BYTES, keep="tail")


def _report(exc: BaseException, *, frames: bool) -> traceback.TracebackException:
    """What `traceback` formats of `exc` (with its frames or only its last line), every message and note
    of its chain cut to `MESSAGE_KEEP` characters at each end first. The messages are kept in
    `TracebackException._str`, in Python 3.11 to 3.13; should a release move them, nothing is cut and
    the text is as long as the messages are."""
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__ if frames else None, compact=True)
    seen: set[int] = set()
    pending = [report]
    while pending:
        part = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        state = vars(part)
        if isinstance(state.get("_str"), str):
            state["_str"] = _cut_message(state["_str"])
        if isinstance(state.get("__notes__"), list):
            state["__notes__"] = [_cut_message(n) if isinstance(n, str) else n for n in state["__notes__"]]
        pending.extend(p for p in (part.__cause__, part.__context__, *(part.exceptions or ())) if p is not None)
    return report


def _cut_message(text: str) -> str:
    if len(text) <= 3 * MESSAGE_KEEP:
        return text
    cut = len(text) - 2 * MESSAGE_KEEP
    return f"{text[:MESSAGE_KEEP]} ... ({cut:,} characters cut) ... {text[-MESSAGE_KEEP:]}"


class OutcomePolicy:
    def __init__(self, settings: Settings, worker_id: str, events: EventHub | None = None) -> None:
        self.settings = settings
        self.worker_id = worker_id
        #: A completion builds its `JobCompleted` only while someone listens (the others are rare).
        self._events = events

    # -- the two ways a handler ends ----------------------------------------------------------------

    def after_return(self, attempt: Attempt, result: Any) -> Decision:
        signals = attempt.signals
        if not signals.requested:  # nothing asked it to stop (the common case): it finished
            return self._completed(attempt, result)
        if StopReason.LEASE_LOST in signals:
            return self._lease_lost(attempt)
        if StopReason.CANCELLED in signals:
            return self.cancelled(attempt)
        if StopReason.TIMEOUT in signals:
            return self.timed_out(attempt)
        if signals.observed:  # it saw a stop request and returned: it stopped early, it did not finish
            if StopReason.FENCED in signals:
                return self.fenced(attempt)
            if StopReason.SHUTDOWN in signals:
                return self.release(attempt)
        return self._completed(attempt, result)

    def after_error(self, attempt: Attempt, exc: BaseException, *, cancelled_by_worker: bool = False) -> Decision:
        if isinstance(exc, JobParked):  # a durable wait parked the job and gave its lease back itself
            return Decision(None, kind="waiting")
        signals = attempt.signals
        if StopReason.LEASE_LOST in signals or isinstance(exc, LeaseLostError):
            return self._lease_lost(attempt, exc)
        if StopReason.CANCELLED in signals:
            return self.cancelled(attempt)
        if StopReason.TIMEOUT in signals:
            return self.timed_out(attempt)
        if cancelled_by_worker:
            return self.fenced(attempt) if StopReason.FENCED in signals else self.release(attempt)
        if isinstance(exc, Snooze):
            try:  # checked here, not in Snooze: errors.py sits below durations.py
                delay = seconds_or_none("Snooze delay", exc.delay, allow_zero=True)
                if delay is None:
                    raise InvalidJobError("Snooze delay must be seconds (a number) or a timedelta, got None")
            except Exception as invalid:  # a hostile __repr__ too: the attempt fails, the worker goes on
                return self.failure(attempt, invalid)
            return self.snoozed(attempt, delay)
        return self.failure(attempt, exc)

    # -- outcomes -----------------------------------------------------------------------------------

    def release(self, attempt: Attempt) -> Decision:
        """Shutdown: the job is available again at once and the attempt does not count (logged by the
        worker once the release is written)."""
        claimed = attempt.claimed
        outcome = Outcome(claimed.id, claimed.lease_token, JobStatus.QUEUED, released=True, kind="released")
        return Decision(outcome, kind="released")

    def unstarted(self, attempt: Attempt) -> Decision:
        """A claim whose handler was not started in time: given back as a release is, and a job that
        never started before is again one never started (its expiry still concerns it)."""
        claimed = attempt.claimed
        outcome = Outcome(claimed.id, claimed.lease_token, JobStatus.QUEUED, released=True, kind="unstarted")
        return Decision(outcome, kind="released")

    def snoozed(self, attempt: Attempt, delay: float) -> Decision:
        """Not ready yet: queued again after `delay`, the attempt not counted, the checkpoint kept."""
        claimed = attempt.claimed
        logger.info("job %s snoozed for %g s", claimed.id, delay, extra=attempt.log_extra(self.worker_id))
        outcome = Outcome(
            claimed.id, claimed.lease_token, JobStatus.QUEUED, delay_seconds=delay, released=True, kind="snoozed"
        )
        return Decision(outcome, kind="snoozed")

    def fenced(self, attempt: Attempt) -> Decision:
        """The worker lost the database: the job goes back (the attempt counts), unless already recovered."""
        claimed = attempt.claimed
        message = (
            f"worker {self.worker_id} lost the database during attempt {claimed.attempts} of "
            f"{claimed.max_attempts} and gave the job up"
        )
        return self._retry_or_fail(attempt, message, None, delay=0.0)

    def cancelled(self, attempt: Attempt) -> Decision:
        claimed = attempt.claimed
        outcome = Outcome(claimed.id, claimed.lease_token, JobStatus.CANCELLED, kind="cancelled")
        return Decision(outcome, JobCancelled(claimed.id, claimed.type, claimed.queue, JobStatus.RUNNING), "cancelled")

    def timed_out(self, attempt: Attempt) -> Decision:
        return self._retry_or_fail(attempt, f"timed out after {attempt.timeout or 0.0:g} s", None, timed_out=True)

    def failure(self, attempt: Attempt, exc: BaseException, prefix: str = "") -> Decision:
        message = error_text(exc, prefix, _note(exc))
        if isinstance(exc, NonRetryableError):
            return self.failed_for_good(attempt, message, level=logging.WARNING, exc=exc)
        return self._retry_or_fail(attempt, message, exc)

    def failed_for_good(
        self, attempt: Attempt, message: str, *, level: int = logging.ERROR, exc: BaseException | None = None
    ) -> Decision:
        claimed = attempt.claimed
        message = storable_text(message)
        trace = traceback_text(exc) if exc is not None else None
        self._log_failure(attempt, level, trace, "job %s failed (not retryable): %s", claimed.id, message)
        return Decision(
            Outcome(claimed.id, claimed.lease_token, JobStatus.FAILED, error=message, kind="failed", traceback=trace),
            JobFailed(claimed.id, claimed.type, claimed.queue, claimed.attempts, message),
            "failed",
        )

    # -- helpers ------------------------------------------------------------------------------------

    def _completed(self, attempt: Attempt, result: Any) -> Decision:
        claimed = attempt.claimed
        if result is None:
            result_json = None
        else:
            try:
                result_json = json_text("the handler's return value", result, self.settings.max_payload_bytes)
                if self.settings.encryption_keys:
                    result_json = self._sealed_result(result_json, claimed.id)
            except InvalidJobError as exc:
                return self.failed_for_good(attempt, str(exc))
            except Exception as exc:  # a hostile __str__, __len__ or encoder hook
                return self.failed_for_good(attempt, error_text(exc, "the handler's return value cannot be stored: "))
        outcome = Outcome(
            claimed.id, claimed.lease_token, JobStatus.COMPLETED, result_json=result_json, kind="completed"
        )
        if self._events is not None and not self._events.active:
            return Decision(outcome, None, "completed")
        return Decision(
            outcome, JobCompleted(claimed.id, claimed.type, claimed.queue, claimed.attempts, result), "completed"
        )

    def _sealed_result(self, text: str, job_id: uuid.UUID) -> str:
        keyring = keyring_of(self.settings.encryption_keys)
        assert keyring is not None
        limit = self.settings.max_payload_bytes
        return sealed_within("the handler's return value", keyring.seal_text(text, "result", job_id), len(text), limit)

    def _retry_or_fail(
        self,
        attempt: Attempt,
        message: str,
        exc: BaseException | None,
        *,
        delay: float | None = None,
        timed_out: bool = False,
    ) -> Decision:
        claimed = attempt.claimed
        trace = traceback_text(exc) if exc is not None else None
        if claimed.attempts >= claimed.max_attempts:
            kind = "timed_out" if timed_out else "failed"
            self._log_failure(
                attempt,
                logging.ERROR,
                trace,
                "job %s failed on its last attempt (%d of %d): %s",
                claimed.id,
                claimed.attempts,
                claimed.max_attempts,
                message,
            )
            return Decision(
                Outcome(claimed.id, claimed.lease_token, JobStatus.FAILED, error=message, kind=kind, traceback=trace),
                JobFailed(claimed.id, claimed.type, claimed.queue, claimed.attempts, message),
                kind,
            )
        if delay is None:
            delay = self._backoff(attempt, exc)
        self._log_failure(
            attempt,
            logging.WARNING,
            trace,
            "job %s attempt %d of %d failed, retrying in %.1f s: %s",
            claimed.id,
            claimed.attempts,
            claimed.max_attempts,
            delay,
            message,
        )
        kind = "timed_out" if timed_out else "retried"
        return Decision(
            Outcome(
                claimed.id,
                claimed.lease_token,
                JobStatus.QUEUED,
                error=message,
                delay_seconds=delay,
                kind=kind,
                traceback=trace,
            ),
            JobRetried(claimed.id, claimed.type, claimed.queue, claimed.attempts, message, delay),
            kind,
        )

    def _log_failure(self, attempt: Attempt, level: int, trace: str | None, message: str, *args: object) -> None:
        """One record at `level` with the stored error (masked and bounded, never the exception
        formatted again). A final failure (ERROR) carries the stored traceback; a retry or an expected
        failure is one line, and its traceback a DEBUG record of its own."""
        extra = attempt.log_extra(self.worker_id)
        if trace is not None and level >= logging.ERROR:
            logger.log(level, message + "\n%s", *args, trace.rstrip("\n"), extra=extra)
            return
        logger.log(level, message, *args, extra=extra)
        if trace is not None and logger.isEnabledFor(logging.DEBUG):
            claimed = attempt.claimed
            logger.debug(
                "job %s: traceback of attempt %d:\n%s", claimed.id, claimed.attempts, trace.rstrip("\n"), extra=extra
            )

    def _backoff(self, attempt: Attempt, exc: BaseException | None) -> float:
        """The handler's own policy when it has one, else the settings' formula (also when its policy
        fails or returns nonsense: a job is never lost to a broken backoff)."""
        attempts = attempt.claimed.attempts
        policy = attempt.handler.backoff
        if policy is not None and exc is not None:
            try:
                delay = seconds_or_none("the handler's backoff", policy(attempts, exc), allow_zero=True)
            except Exception as error:
                logger.error(
                    "job %s: the backoff of %s failed (%s); using the settings' backoff instead",
                    attempt.id,
                    attempt.claimed.type,
                    error_text(error),
                    extra=attempt.log_extra(self.worker_id),
                )
            else:
                assert delay is not None
                return delay
        return backoff_seconds(
            attempts,
            base_seconds=self.settings.retry_base_delay_seconds,
            max_seconds=self.settings.retry_max_delay_seconds,
            jitter=self.settings.retry_jitter,
        )

    def _lease_lost(self, attempt: Attempt, exc: BaseException | None = None) -> Decision:
        if StopReason.FENCED in attempt.signals and StopReason.LEASE_LOST not in attempt.signals:
            return self.fenced(attempt)
        detail = f": {exc}" if isinstance(exc, LeaseLostError) else ""
        logger.warning(
            "job %s: lease lost during attempt %d (expired or taken over); its outcome is not written%s",
            attempt.id,
            attempt.claimed.attempts,
            detail,
            extra=attempt.log_extra(self.worker_id),
        )
        return NOTHING


def _note(exc: BaseException) -> str:
    """What a `BaseException` from a handler means: a failed attempt, never a stop of the worker."""
    if isinstance(exc, Exception):
        return ""
    if isinstance(exc, asyncio.CancelledError):
        return " (escaped the handler; the worker did not cancel it: an inner task's cancellation?)"
    return f" ({type(exc).__name__} raised by the handler fails the attempt; it does not stop the worker)"
