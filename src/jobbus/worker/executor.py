"""The executor: runs one attempt from its claim to its durable outcome.

claim → JobStarted → enter the job scope → run the handler (async in the job's task, sync in the
worker's thread pool, bounded by `concurrency`) → decide the outcome (`outcomes.py`) → free the slot →
write the outcome through the completer → exit the scope → count and announce.

Nothing a handler does can end the worker: every `BaseException` it raises is an outcome. Only a
cancellation the worker itself started (shutdown, timeout, a lost lease) cancels a handler's task,
and only while the handler's own code runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import TYPE_CHECKING, Any

from jobbus import tracing
from jobbus.encryption import MARKER, MissingKeyError, UnreadablePayloadError
from jobbus.events import JobEvent, JobFailed, JobStarted
from jobbus.execution import StopReason, SyncJobExecution, enter_job, leave_job
from jobbus.jsontext import UndecodableJson
from jobbus.models import JobStatus
from jobbus.registry import Registry
from jobbus.worker.attempt import Answer, Attempt, Batch, Phase
from jobbus.worker.completer import Completer, Written
from jobbus.worker.outcomes import Decision, OutcomePolicy, error_text, traceback_text

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from jobbus.store import Outcome
    from jobbus.worker.batches import BatchCall

logger = logging.getLogger("jobbus.worker")


class Executor:
    def __init__(
        self,
        registry: Registry,
        *,
        policy: OutcomePolicy,
        completer: Completer,
        threads: ThreadPoolExecutor,
        worker_id: str,
        on_handler_done: Callable[[Attempt], None],
        on_slot_free: Callable[[Attempt], None],
        on_finished: Callable[[Attempt, JobStatus | None, str], None],
        on_slots_free: Callable[[list[Attempt]], None] | None = None,
    ) -> None:
        self.registry = registry
        self.policy = policy
        self.completer = completer
        self.threads = threads
        self.worker_id = worker_id
        self._on_handler_done = on_handler_done
        self._on_slot_free = on_slot_free
        self._on_finished = on_finished
        #: The jobs of a batch run in one task free their slot together (`on_slot_free` of each by default).
        self._on_slots_free = on_slots_free or self._each_slot_free
        #: The tasks announcing the events of a batch's jobs (kept referenced until they end).
        self._announcing: set[asyncio.Task[None]] = set()
        settings = policy.settings
        #: A handler starts only while its lease has this long to run, half-way between the whole lease
        #: and one heartbeat: the monitor's first renewal comes at most a heartbeat after the start.
        self._start_margin = (settings.lease_seconds + settings.heartbeat_seconds) / 2

    def start(self, attempt: Attempt, tracer: Tracer | None = None) -> None:
        """Run the attempt in its own task; with a `tracer`, inside its `process {queue}` span."""
        run = self._run_attempt(attempt, None) if tracer is None else self._run_traced(attempt, tracer)
        attempt.task = asyncio.create_task(run)  # unnamed: a name costs a formatted id per job

    async def _run_traced(self, attempt: Attempt, tracer: Tracer) -> None:
        with tracing.processing(attempt.claimed, tracer) as span:
            await self._run_attempt(attempt, span)

    async def _run_attempt(self, attempt: Attempt, span: Span | None) -> None:
        status: JobStatus | None = None
        kind = "lost"
        error: BaseException | None = None
        decision: Decision | None = None
        handed_over = False
        try:
            scope: AbstractAsyncContextManager[Any] | None = None
            events = self.registry.events
            if events.active:
                claimed = attempt.claimed
                await events.emit(JobStarted(claimed.id, claimed.type, claimed.queue, claimed.attempts))
            decision = self._undecodable(attempt)
            if decision is None:
                scope, decision = await self._enter_scope(attempt)
            if decision is None and (
                time.monotonic() > attempt.lease_deadline - self._start_margin or attempt.lost or attempt.fenced
            ):
                decision = self._not_started(attempt)
            if decision is None:
                decision, error = await self._call_handler(attempt)
            elif attempt.batch is not None:
                attempt.batch.withdraw(attempt)  # its batch's call goes on without it
            if attempt.execution._log is not None:  # the handler logged: its lines go with the outcome
                keep_logs(attempt, decision)
            attempt.phase = Phase.WRITING
            self._on_slot_free(attempt)  # the next claim may use the slot while the outcome is written
            if decision.outcome is not None and scope is None and span is None and not events.active:
                # Nothing of this attempt waits for its write (no scope to exit, no event, no span): the
                # completer ends it, and this task ends now instead of being woken for the bookkeeping.
                written = partial(self._written, attempt, decision)
                self.completer.submit(decision.outcome, attempt.lease_deadline, written)
                handed_over = True
                return
            status, event = await self._write(attempt, decision)
            kind = _kind(decision, status)
            attempt.signals.close()
            if scope is not None:
                await self._exit_scope(attempt, scope, error)
            if event is not None and events.active:
                await events.emit(event)
        except Exception:
            logger.exception("job %s: internal error in the worker", attempt.id, extra=self._extra(attempt))
            if attempt.batch is not None:
                attempt.batch.withdraw(attempt)
        finally:
            if not handed_over:
                self._end(attempt, status, kind, span, error, decision.outcome if decision is not None else None)

    def _written(self, attempt: Attempt, decision: Decision, written: Written) -> None:
        """The end of an attempt handed to the completer by `submit`, once its round is written."""
        status, refusal = written.get(attempt.id, (None, None))
        status, _ = self._recorded(attempt, decision, status, refusal)
        self._end(attempt, status, _kind(decision, status), None, None)

    def _end(
        self,
        attempt: Attempt,
        status: JobStatus | None,
        kind: str,
        span: Span | None,
        error: BaseException | None,
        outcome: Outcome | None = None,
    ) -> None:
        attempt.stop_timers()
        attempt.signals.close()
        if span is not None:
            stored = (outcome.error, outcome.traceback) if outcome is not None else (None, None)
            tracing.attempt_ended(span, kind, error, *stored)
        self._on_finished(attempt, status, kind)

    # -- steps --------------------------------------------------------------------------------------

    def _undecodable(self, attempt: Attempt) -> Decision | None:
        """A job whose stored JSON is too large or cannot be decoded here (nested too deeply, or sealed and
        altered) fails at once; one sealed with a key this worker lacks fails its attempt."""
        oversized = attempt.claimed.oversized_bytes
        if oversized is not None:
            limit = self.policy.settings.max_payload_bytes
            return self.policy.failed_for_good(
                attempt,
                f"the job's configuration is {oversized} bytes as stored, over this worker's max_payload_bytes "
                f"({limit}): it was not loaded",
            )
        for what, value in (
            ("configuration", attempt.claimed.configuration_data),
            ("execution data", attempt.claimed.execution_data),
        ):
            if isinstance(value, UndecodableJson):
                return self.policy.failed_for_good(attempt, f"the job's {what} cannot be decoded: {value.reason}")
        configuration, data = attempt.claimed.configuration_data, attempt.claimed.execution_data
        # Tested without a call: a job stored in clear pays nothing here (`make gate`).
        if not ((configuration is not None and MARKER in configuration) or MARKER in data):
            return None
        try:
            attempt.execution.open_payloads()
        except MissingKeyError as exc:  # a later attempt, on a worker given the key, runs it: nothing is lost
            return self.policy.failure(attempt, exc)
        except UnreadablePayloadError as exc:
            return self.policy.failed_for_good(attempt, str(exc))
        return None

    def _not_started(self, attempt: Attempt) -> Decision:
        """A claim that waited too long for its handler (the process frozen, the loop blocked, the claim
        answered late) is given back unstarted: its lease may be over and the job running elsewhere."""
        logger.warning(
            "job %s: its handler was not started, with %.1f s of its lease left where its first renewal needs "
            "%.1f s (the worker was frozen, its event loop blocked, or its claim answered late); given back for "
            "another attempt, which this one does not count",
            attempt.id,
            max(0.0, attempt.lease_deadline - time.monotonic()),
            self._start_margin,
            extra=self._extra(attempt),
        )
        return self.policy.unstarted(attempt)

    async def _enter_scope(self, attempt: Attempt) -> tuple[AbstractAsyncContextManager[Any] | None, Decision | None]:
        factory = self.registry.job_scope
        if factory is None:
            return None, None
        try:
            scope = factory(attempt.execution)
            attempt.execution.scope = await scope.__aenter__()
        except asyncio.CancelledError:
            raise  # cancelled from outside the worker: the host is tearing the loop down
        except BaseException as exc:
            return None, self.policy.failure(attempt, exc, "entering the job scope failed: ")
        return scope, None

    async def _call_handler(self, attempt: Attempt) -> tuple[Decision, BaseException | None]:
        if attempt.batch is not None:
            return await self._call_batched(attempt, attempt.batch)
        if attempt.timeout is not None:
            loop = asyncio.get_running_loop()
            attempt.timer = loop.call_later(attempt.timeout, self._time_out, attempt)
        if attempt.handler.is_async:
            return await self._call_async(attempt)
        return await self._call_sync(attempt)

    def start_timer(self, attempt: Attempt) -> None:
        """A batch's job: its timeout counts from the call of its batch's handler."""
        if attempt.timeout is not None:
            attempt.timer = asyncio.get_running_loop().call_later(attempt.timeout, self._time_out, attempt)

    async def _call_batched(self, attempt: Attempt, batch: Batch) -> tuple[Decision, BaseException | None]:
        """A batch's job waits for its batch's call and decides its own outcome from its answer. The
        worker may cancel this wait (its timeout, a cancellation past its grace, a lost lease, a
        shutdown): the job ends alone, the call goes on for the others."""
        task = attempt.task
        waiting = batch.arrive(attempt)
        attempt.in_handler = True
        try:
            answer = await waiting
        except asyncio.CancelledError as exc:
            attempt.in_handler = False
            self._returned(attempt)
            if attempt.cancelled_for is not None:  # the worker cancelled it: shutdown, timeout, lost lease
                if task is not None:
                    task.uncancel()
                batch.ended_alone()
                return self.policy.after_error(attempt, exc, cancelled_by_worker=True), exc
            raise  # cancelled from outside the worker: the host is tearing the loop down
        attempt.in_handler = False
        self._returned(attempt)
        if answer.raised is not None:
            return self.policy.after_error(attempt, answer.raised), answer.raised
        return self.policy.after_return(attempt, answer.item), None

    # -- a batch in one task ------------------------------------------------------------------------

    async def run_batch(self, batch: BatchCall) -> None:
        """A batch whose jobs need nothing of their own around their handler (no job scope, no span) runs
        in this one task: each job still gets its own checks, timeout, interruption (it ends alone,
        `stop_batched`), fenced outcome and events, and the outcomes go to the completer together. Per
        job this saves a task, its wake-ups, a future and a completer callback."""
        members = batch.members
        try:
            events = self.registry.events
            if events.active:
                for attempt in members:
                    if attempt.in_handler:
                        claimed = attempt.claimed
                        await events.emit(JobStarted(claimed.id, claimed.type, claimed.queue, claimed.attempts))
            decided: list[tuple[Attempt, Decision]] = []
            waiting: list[Attempt] = []
            latest = time.monotonic() + self._start_margin
            for attempt in members:
                if not attempt.in_handler:
                    continue  # interrupted while the batch took jobs: it ended alone
                decision = self._undecodable(attempt)
                if decision is None and (latest > attempt.lease_deadline or attempt.lost or attempt.fenced):
                    decision = self._not_started(attempt)
                if decision is None:
                    waiting.append(attempt)
                else:
                    attempt.in_handler = False
                    decided.append((attempt, decision))
            if decided:
                self._hand_over(decided)
            if not waiting:
                return
            answers = await self._call_batch(batch, waiting)
            if answers is None:
                return  # every job of the call ended alone
            decided = []
            returned = time.monotonic()
            check = self._on_handler_done
            for attempt, answer in zip(waiting, answers, strict=True):
                if not attempt.in_handler:
                    continue  # ended alone during the call: its item is ignored
                attempt.in_handler = False
                attempt.signals.close()  # `_returned`, with one reading of the clock for the batch
                attempt.ran_seconds = returned - attempt.started
                check(attempt)
                if answer.raised is not None:
                    decision = self.policy.after_error(attempt, answer.raised)
                else:
                    decision = self.policy.after_return(attempt, answer.item)
                decided.append((attempt, decision))
            self._hand_over(decided)
        except Exception:
            logger.exception(
                "batch of %s: internal error in the worker",
                batch.handler.type,
                extra={"job_type": batch.handler.type, "worker_id": self.worker_id},
            )
        finally:
            for attempt in members:
                if attempt.phase is Phase.RUNNING:  # not handed over: an internal error, or the loop torn down
                    attempt.in_handler = False
                    self._end(attempt, None, "lost", None, None)

    async def _call_batch(self, batch: BatchCall, waiting: list[Attempt]) -> list[Answer] | None:
        """The handler's call for the jobs `waiting`, their timeouts counting from it (one timer for the
        jobs that share a timeout); None when every one of them ended alone and the call was cancelled."""
        loop = asyncio.get_running_loop()
        timers: list[asyncio.TimerHandle] = []
        timed: dict[float, list[Attempt]] = {}
        for attempt in waiting:
            if attempt.timeout is not None:
                timed.setdefault(attempt.timeout, []).append(attempt)
        for timeout, attempts in timed.items():
            timers.append(loop.call_later(timeout, self._time_out_all, attempts))
        batch.calling = True
        try:
            result = await batch.call_handler(waiting)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if batch.abandoned:
                if task is not None:
                    task.uncancel()
                return None
            if task is not None and task.cancelling():
                raise  # cancelled from outside the worker: the host is tearing the loop down
            return [Answer(raised=exc)] * len(waiting)  # the handler's own CancelledError
        except BaseException as exc:
            return [Answer(raised=exc)] * len(waiting)
        finally:
            batch.calling = False
            for timer in timers:
                timer.cancel()
        return batch.answers(result, len(waiting))

    def _each_slot_free(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            self._on_slot_free(attempt)

    def _time_out_all(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            self._time_out(attempt)

    def stop_batched(self, batch: BatchCall, attempt: Attempt) -> None:
        """A job of a batch run in one task was interrupted (its timeout, a cancellation past its grace, a
        lost lease, a shutdown): it ends alone now, as the worker's cancellation of its handler."""
        attempt.in_handler = False
        self._returned(attempt)
        exc = asyncio.CancelledError()
        self._hand_over([(attempt, self.policy.after_error(attempt, exc, cancelled_by_worker=True))])

    def _hand_over(self, decided: list[tuple[Attempt, Decision]]) -> None:
        """Jobs of a batch whose outcome is decided free their part of its slot; their outcomes go to the
        completer in one go, and the jobs end once they are written."""
        for attempt, decision in decided:
            attempt.phase = Phase.WRITING
            if attempt.execution._log is not None:
                keep_logs(attempt, decision)
        self._on_slots_free([attempt for attempt, _ in decided])
        writing = [(attempt, decision) for attempt, decision in decided if decision.outcome is not None]
        if len(writing) < len(decided):  # nothing to write (no batch handler's outcome is so today)
            for attempt, decision in decided:
                if decision.outcome is None:
                    self._end(attempt, None, _kind(decision, None), None, None)
        if writing:
            outcomes = [decision.outcome for _, decision in writing if decision.outcome is not None]
            deadlines = [attempt.lease_deadline for attempt, _ in writing]
            self.completer.submit_many(outcomes, deadlines, partial(self._all_written, writing))

    def _all_written(self, writing: list[tuple[Attempt, Decision]], written: Written) -> None:
        """`_written` for the jobs of a batch handed over together, once their round is written."""
        finished = self._on_finished
        announce = self.registry.events.active
        ended: list[tuple[Attempt, JobStatus | None, str, JobEvent | None]] = []
        for attempt, decision in writing:
            try:
                outcome = decision.outcome
                assert outcome is not None
                status, refusal = written.get(attempt.claimed.id, _NOT_WRITTEN)
                if status is outcome.status and refusal is None:  # written as asked: the common case
                    kind, event = decision.kind, decision.event
                else:
                    status, event = self._recorded(attempt, decision, status, refusal)
                    kind = _kind(decision, status)
                if attempt.timer is not None or attempt.cancel_timer is not None:
                    attempt.stop_timers()
                attempt.signals.close()
                if announce:
                    ended.append((attempt, status, kind, event))
                else:
                    finished(attempt, status, kind)
            except Exception:
                logger.exception("job %s: the bookkeeping after its outcome failed", attempt.claimed.id)
        if ended:  # the jobs stay in flight until their events are announced, as a job's own task keeps it
            task = asyncio.get_running_loop().create_task(self._announce(ended))
            self._announcing.add(task)
            task.add_done_callback(self._announcing.discard)

    async def _announce(self, ended: list[tuple[Attempt, JobStatus | None, str, JobEvent | None]]) -> None:
        """The events of jobs of a batch run in one task, once their outcomes are written; then their end."""
        events = self.registry.events
        done = 0
        try:
            for attempt, status, kind, event in ended:
                if event is not None and events.active:
                    await events.emit(event)
                done += 1
                self._on_finished(attempt, status, kind)
        finally:
            for attempt, status, kind, _ in ended[done:]:
                self._on_finished(attempt, status, kind)

    def _time_out(self, attempt: Attempt) -> None:
        """At the timeout: an async handler is cancelled; a sync one is told (a thread cannot be
        stopped) and keeps its slot and lease until it returns, then the timeout is recorded."""
        if attempt.phase is not Phase.RUNNING:
            return
        attempt.interrupt(StopReason.TIMEOUT)
        if not attempt.handler.is_async:
            logger.warning(
                "job %s is overrunning its timeout of %g s: a sync handler's thread cannot be stopped, so it "
                "keeps its slot and lease until it returns; the attempt will be recorded as timed out",
                attempt.id,
                attempt.timeout,
                extra=self._extra(attempt),
            )

    def _returned(self, attempt: Attempt) -> None:
        """The handler's code ended: note a lease that expired or a fence that fell meanwhile. The
        attempt is over for the handler's code: a task it leaked runs no step, wait or spawn."""
        attempt.signals.close()
        attempt.ran_seconds = time.monotonic() - attempt.started
        self._on_handler_done(attempt)

    async def _call_async(self, attempt: Attempt) -> tuple[Decision, BaseException | None]:
        task = attempt.task
        attempt.in_handler = True
        token = enter_job(attempt.execution)  # this job's own task: no other job sees it
        try:
            result = await attempt.handler.func(attempt.execution)
        except asyncio.CancelledError as exc:
            attempt.in_handler = False
            self._returned(attempt)
            if attempt.cancelled_for is not None:  # the worker cancelled it: shutdown, timeout, lost lease
                if task is not None:
                    task.uncancel()
                return self.policy.after_error(attempt, exc, cancelled_by_worker=True), exc
            if task is not None and task.cancelling():
                raise  # cancelled from outside the worker: the host is tearing the loop down
            return self.policy.after_error(attempt, exc), exc  # the handler's own CancelledError
        except BaseException as exc:
            attempt.in_handler = False
            self._returned(attempt)
            if attempt.cancelled_for is not None and task is not None:
                task.uncancel()
            return self.policy.after_error(attempt, exc), exc
        finally:
            leave_job(token)
        attempt.in_handler = False
        self._returned(attempt)
        if attempt.cancelled_for is not None and task is not None:
            task.uncancel()  # it swallowed the worker's cancellation and returned
        return self.policy.after_return(attempt, result), None

    async def _call_sync(self, attempt: Attempt) -> tuple[Decision, BaseException | None]:
        """In the worker's thread pool (as many threads as `concurrency`). A thread cannot be
        interrupted: the attempt keeps its slot and its lease until the function returns."""
        loop = asyncio.get_running_loop()
        execution = SyncJobExecution(attempt.execution, loop)
        try:
            # In a copy of the task's context, as asyncio.to_thread does: the handler's thread sees the
            # attempt's context variables (its trace span among them).
            context = contextvars.copy_context()
            result = await loop.run_in_executor(self.threads, context.run, _in_thread, attempt.handler.func, execution)
        except asyncio.CancelledError:
            raise  # the worker never cancels a sync attempt's task: this comes from outside
        except BaseException as exc:
            self._returned(attempt)
            raised = exc.raised if isinstance(exc, _Raised) else exc
            return self.policy.after_error(attempt, raised), raised
        self._returned(attempt)
        return self.policy.after_return(attempt, result), None

    async def _write(self, attempt: Attempt, decision: Decision) -> tuple[JobStatus | None, JobEvent | None]:
        """Write the outcome; returns the status it recorded and the event to announce (None: nothing)."""
        outcome = decision.outcome
        if outcome is None:
            return None, None
        try:
            status, refusal = await self.completer.write(outcome, attempt.lease_deadline)
        except Exception:
            logger.exception("job %s: writing its outcome failed", attempt.id, extra=self._extra(attempt))
            return None, None
        return self._recorded(attempt, decision, status, refusal)

    def _recorded(
        self, attempt: Attempt, decision: Decision, status: JobStatus | None, refusal: str | None
    ) -> tuple[JobStatus | None, JobEvent | None]:
        """What the write of the decision's outcome recorded (the status, None when the lease was lost
        first) and the event to announce."""
        outcome = decision.outcome
        assert outcome is not None
        if status is None:
            logger.warning(
                "job %s: lease lost before its outcome (%s) could be written; another attempt owns the job now",
                attempt.id,
                outcome.status.value,
                extra=self._extra(attempt),
            )
            return None, None
        claimed = attempt.claimed
        if status is JobStatus.CANCELLED and outcome.status is not JobStatus.CANCELLED:
            # Its cancellation was asked for before the outcome was written, after the worker last read
            # the flag: the job is cancelled, whatever the handler did.
            logger.info(
                "job %s: cancelled (asked for before its %s outcome was written)",
                attempt.id,
                outcome.kind or outcome.status.value,
                extra=self._extra(attempt),
            )
            return status, self.policy.cancelled(attempt).event
        if refusal is not None:
            return JobStatus.FAILED, JobFailed(claimed.id, claimed.type, claimed.queue, claimed.attempts, refusal)
        return outcome.status, decision.event

    async def _exit_scope(
        self, attempt: Attempt, scope: AbstractAsyncContextManager[Any], error: BaseException | None
    ) -> None:
        try:
            await scope.__aexit__(type(error) if error else None, error, error.__traceback__ if error else None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the application's code: logged masked and bounded, as a handler's error
            logger.error(
                "job %s: exiting the job scope failed: %s\n%s",
                attempt.id,
                error_text(exc),
                traceback_text(exc).rstrip("\n"),
                extra=self._extra(attempt),
            )

    def _extra(self, attempt: Attempt) -> dict[str, Any]:
        return attempt.log_extra(self.worker_id)


def keep_logs(attempt: Attempt, decision: Decision) -> None:
    """The attempt is decided: its log is closed (a line logged later is not kept) and its lines go
    with the outcome, written in the outcome's own statement. An attempt whose outcome is not written
    (its lease was lost) keeps none; one that parked in a durable wait wrote them when it parked."""
    log = attempt.execution._log
    assert log is not None
    logs = log.stored(close=True)
    if decision.outcome is not None:
        decision.outcome.logs = logs


def _kind(decision: Decision, status: JobStatus | None) -> str:
    """Which of `OUTCOME_KINDS` the attempt ended as, once its write is known (`lost`: nothing written)."""
    if status is None:
        return "waiting" if decision.kind == "waiting" else "lost"
    asked = decision.outcome.status if decision.outcome is not None else None
    return decision.kind if status is asked else status.value


#: What `written.get` gives a job whose outcome was not written (its lease was lost).
_NOT_WRITTEN: tuple[None, None] = (None, None)


class _Raised(Exception):
    """Carries a `BaseException` out of a handler's thread as data: re-raised through the event loop,
    `GeneratorExit` or `KeyboardInterrupt` would be mistaken for the loop's own."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)  # not its repr: a message of any length would be copied
        self.raised = raised


def _in_thread(func: Callable[[SyncJobExecution], Any], execution: SyncJobExecution) -> Any:
    token = enter_job(execution)  # the pool thread's context: reset before the thread runs another job
    try:
        return func(execution)
    except Exception:
        raise
    except BaseException as exc:
        raise _Raised(exc) from None
    finally:
        leave_job(token)
