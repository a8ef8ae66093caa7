"""The producer: the claim loop (River's producer). It claims jobs for the free slots and starts an
attempt for each, until it is stopped, has drained, or has taken what `--limit` allows.

A slot is held by a running handler: an outcome waiting for the completer holds none, so the next
claim overlaps the outcome writes, but more waiting outcomes than `OUTCOMES_PER_SLOT` times the
concurrency stop the claims (backpressure). A full claim is followed by another as soon as a slot
frees; otherwise the loop sleeps until a notification (a job it can take, a control command), the
end of an attempt, or the poll interval. Draining ends when nothing is in flight and a claim that
started with nothing in flight found nothing, in the table itself rather than in the claimer's list
of non-empty queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jobbus import tracing
from jobbus.execution import AttemptSignals, JobExecution, StopReason
from jobbus.models import ClaimedJob, JobStatus
from jobbus.resilience import Backoff, Outage, is_transient
from jobbus.store import Statement
from jobbus.worker.app_view import AppView
from jobbus.worker.attempt import Attempt, Phase
from jobbus.worker.claimer import CLAIM_BATCH_WAIT_SECONDS, Claimer
from jobbus.worker.completer import Completer
from jobbus.worker.control import ControlReader
from jobbus.worker.executor import Executor
from jobbus.worker.monitor import Monitor
from jobbus.worker.observer import Observers
from jobbus.worker.options import WorkerOptions
from jobbus.worker.outcomes import OutcomePolicy

logger = logging.getLogger("jobbus.worker")

#: Outcomes waiting for the completer, per slot, beyond which the claims stop. At 1 a claim waited for
#: the previous batch's outcomes to be written, so claims and outcome writes never overlapped; a drain
#: of 50,000 no-op jobs (concurrency 200) had a statement in flight 79 % of the time, and at 4 the two
#: overlap: 10.5k → 12.7k jobs/s (2 at 9.8-13.7k; one loaded machine, interleaved runs).
OUTCOMES_PER_SLOT = 4


class Producer:
    """The claim loop: `run()` claims and starts attempts until the worker stops claiming. The attempts
    in flight are in `in_flight` (job id → attempt) from their claim until their outcome is written."""

    def __init__(
        self,
        app: AppView,
        options: WorkerOptions,
        *,
        in_flight: dict[uuid.UUID, Attempt],
        claimer: Claimer,
        control: ControlReader,
        monitor: Monitor,
        policy: OutcomePolicy,
        completer: Completer,
        threads: ThreadPoolExecutor,
        observers: Observers,
        worker_id: str,
        poll_interval: float,
        run_for_handler: Callable[[weakref.ref[Attempt], Statement[Any]], Awaitable[Any]],
        on_fatal: Callable[[str, BaseException], None],
        check_memory: Callable[[], None] | None,
    ) -> None:
        self.registry = app.registry
        self.options = options
        self.settings = app.settings
        self.store = app.store
        self.in_flight = in_flight
        self.claimer = claimer
        self.control = control
        self.monitor = monitor
        self.observers = observers
        self.worker_id = worker_id
        self.poll_interval = poll_interval
        self._run_for_handler = run_for_handler
        self._on_fatal = on_fatal
        self._check_memory = check_memory
        self.executor = Executor(
            self.registry,
            policy=policy,
            completer=completer,
            threads=threads,
            worker_id=worker_id,
            on_handler_done=monitor.check,
            on_slot_free=self._slot_freed,
            on_finished=self._finished,
        )
        self.completed = 0
        self.failed = 0
        self.stopping = False
        self.draining = options.stop_when_empty
        self._running = 0  # attempts holding a slot (phase RUNNING)
        self._claimed_total = 0
        self._wake = asyncio.Event()
        self._control_due = True

    # -- what the worker tells it -------------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more; `run()` returns."""
        self.stopping = True
        self._wake.set()

    def drain(self) -> None:
        """Claim until no job is available, then return from `run()`."""
        self.draining = True
        self._wake.set()

    def jobs_notified(self, queue: str | None, job_type: str | None) -> None:
        if self.claimer.serves(queue, job_type):
            self._wake.set()

    def control_notified(self) -> None:
        self._control_due = True
        self._wake.set()

    async def wait_for_change(self, seconds: float) -> None:
        """Wait until an attempt ends or the worker is told something, at most `seconds`."""
        self._wake.clear()
        await self._sleep(seconds)

    # -- the claim loop -----------------------------------------------------------------------------

    def _free_slots(self) -> int:
        """Slots are held by running handlers; outcomes waiting for the completer do not hold one, but
        `OUTCOMES_PER_SLOT` times `concurrency` of them stop the claims (backpressure)."""
        concurrency = self.options.concurrency
        if len(self.in_flight) - self._running >= OUTCOMES_PER_SLOT * concurrency:
            return 0
        free = concurrency - self._running
        limit = self.options.job_limit
        if limit is not None:
            free = min(free, limit - self._claimed_total)
        return max(free, 0)

    async def run(self) -> None:
        backoff = Backoff()
        outage = Outage("worker")
        last_control = float("-inf")
        while not self.stopping:
            self._wake.clear()
            claimed = 0
            free = 0
            deferred = False
            expired_ahead = False
            idle_before_claim = False
            try:
                now = time.monotonic()
                if self._control_due or now - last_control >= self.poll_interval:
                    self._control_due = False
                    last_control = now
                    await self.control.read()
                if self.stopping:
                    break
                free = self._free_slots()
                # An outcome committed during the claim is invisible to it: "nothing available" only
                # counts when nothing was in flight before the claim started.
                idle_before_claim = not self.in_flight
                if free > 0 and not self.control.paused and not self.monitor.fenced:
                    if self.claimer.worth_claiming(free):
                        claimed = self._start(*await self.claimer.claim(free, self.control.paused_queues))
                        expired_ahead = self.claimer.expired_ahead
                    else:
                        deferred = True
                backoff.reset()
                outage.recovered()
            except Exception as exc:
                if not is_transient(exc):
                    self._on_fatal("claim loop", exc)
                    break
                outage.failed(exc)
                await self._sleep(backoff.next_delay())
                continue
            limit = self.options.job_limit
            if limit is not None and self._claimed_total >= limit and not self.in_flight:
                break  # --limit / --run-once: every job we may take has finished
            if (
                self.draining
                and not self.in_flight
                and (self.control.paused or (claimed == 0 and idle_before_claim and not expired_ahead))
            ):
                if not self.control.paused and not self.claimer.read_fresh:
                    self.claimer.forget_pairs()  # look at the table itself before concluding it is empty
                    continue
                logger.info("no job available: worker %s is done draining", self.worker_id)
                break
            if (claimed and claimed == free) or expired_ahead:
                continue  # the claim was full, or cut short by expired jobs: there may be more, claim again
            if deferred:
                await self._sleep(CLAIM_BATCH_WAIT_SECONDS)
                continue
            try:
                wait = await self.claimer.wait_for_limits(self.poll_interval)
            except Exception as exc:
                if not is_transient(exc):
                    self._on_fatal("claim loop", exc)
                    break
                wait = self.poll_interval
            await self._sleep(wait)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    # -- attempts -----------------------------------------------------------------------------------

    def _start(self, jobs: list[ClaimedJob], sent: float) -> int:
        """Every claimed job becomes an attempt with its own task; its lease started after `sent`."""
        tracer = tracing.current_tracer()
        handlers = self.registry.handlers
        build_job_spec = self.registry.build_job_spec
        for claimed in jobs:
            handler = handlers[claimed.type]
            signals = AttemptSignals(cancelled=claimed.cancellation_requested)
            attempt = Attempt(claimed, handler, signals, sent + self.settings.lease_seconds)
            attempt.execution = JobExecution(
                claimed,
                self.store,
                # The attempt by a weak reference: a strong one would make attempt → execution → attempt a
                # cycle that only the cyclic garbage collector frees, a dozen objects per job.
                functools.partial(self._run_for_handler, weakref.ref(attempt)),
                self.settings.lease_seconds,
                self.settings.max_payload_bytes,
                signals,
                build_job_spec,
            )
            attempt.timeout = claimed.timeout_seconds or handler.timeout
            self.in_flight[claimed.id] = attempt
            self._running += 1
            self.executor.start(attempt, tracer)
            if self.observers.active:
                self.observers.claimed(claimed, max(0.0, time.time() - claimed.available_at.timestamp()))
        self._claimed_total += len(jobs)
        return len(jobs)

    def _slot_freed(self, attempt: Attempt) -> None:
        self._running -= 1
        if self._check_memory is not None:  # after each job, before its slot is claimed for again
            self._check_memory()
        self._wake.set()

    def _finished(self, attempt: Attempt, status: JobStatus | None, kind: str) -> None:
        if kind == "released" and StopReason.SHUTDOWN in attempt.signals:  # written: only now is it true
            logger.info("job %s: released at shutdown, available again at once", attempt.id)
        if self.observers.active:
            self.observers.finished(attempt.claimed, kind, attempt.ran_seconds)
        if attempt.phase is Phase.RUNNING:  # ended before reaching its outcome (internal error)
            attempt.phase = Phase.WRITING
            self._running -= 1
        self.in_flight.pop(attempt.id, None)
        if status is JobStatus.QUEUED:  # retried or released: claimable here again, maybe at once
            self.claimer.serves(attempt.claimed.queue, attempt.claimed.type)
        if status is JobStatus.COMPLETED:
            self.completed += 1
        elif status is JobStatus.FAILED:
            self.failed += 1
        self._wake.set()
