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
from typing import TYPE_CHECKING, Any

from jobbus import tracing
from jobbus.execution import AttemptSignals, JobExecution, StopReason
from jobbus.models import ClaimedJob, JobStatus
from jobbus.resilience import Backoff, Outage, is_transient
from jobbus.store import Statement
from jobbus.worker.app_view import AppView
from jobbus.worker.attempt import Attempt, Phase
from jobbus.worker.batches import BatchCall
from jobbus.worker.claimer import CLAIM_BATCH_WAIT_SECONDS, Claimer
from jobbus.worker.completer import Completer
from jobbus.worker.control import ControlReader
from jobbus.worker.executor import Executor
from jobbus.worker.monitor import Monitor
from jobbus.worker.observer import Observers
from jobbus.worker.options import WorkerOptions
from jobbus.worker.outcomes import OutcomePolicy

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from jobbus.registry import Handler

logger = logging.getLogger("jobbus.worker")

#: An open batch (`batch_wait`) claims for its missing jobs at each announcement of its type, and at
#: least every tenth of its wait, but not more often than this.
BATCH_POLL_SECONDS = 0.01

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
            on_slots_free=self._batch_slots_freed,
        )
        self.completed = 0
        self.failed = 0
        self.stopping = False
        self.draining = options.stop_when_empty
        self._running = 0  # attempts holding a slot (phase RUNNING)
        #: Batch jobs in phase RUNNING beyond one per batch holding a slot: with `_running`, the
        #: attempts whose outcome is not waiting for the completer.
        self._in_batches = 0
        #: Outcomes waiting for the completer beyond which the claims stop: `OUTCOMES_PER_SLOT` per slot,
        #: and per job of the largest batch a slot may hold (a batch's outcomes come all at once).
        largest = max((handler.batch_size or 1 for handler in self.registry.handlers.values()), default=1)
        self._outcomes_cap = OUTCOMES_PER_SLOT * options.concurrency * largest
        self._claimed_total = 0
        self._wake = asyncio.Event()
        self._control_due = True
        self._threads = threads
        #: Batches still taking jobs (`batch_wait`), and the tasks that claim for them.
        self._open_batches: set[BatchCall] = set()
        self._gatherers: set[asyncio.Task[None]] = set()

    # -- what the worker tells it -------------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more; `run()` returns."""
        self.stopping = True
        self._wake.set()
        for batch in self._open_batches:
            batch.announced.set()

    def drain(self) -> None:
        """Claim until no job is available, then return from `run()`."""
        self.draining = True
        self._wake.set()

    def jobs_notified(self, queue: str | None, job_type: str | None) -> None:
        if self.claimer.serves(queue, job_type):
            self._wake.set()
            if self._open_batches:
                for batch in self._open_batches:
                    if job_type is None or batch.handler.type == job_type:
                        batch.announced.set()

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
        if len(self.in_flight) - self._running - self._in_batches >= self._outcomes_cap:
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
                limit = self.options.job_limit
                # An outcome committed during the claim is invisible to it: "nothing available" only
                # counts when nothing was in flight before the claim started.
                idle_before_claim = not self.in_flight
                if free > 0 and not self.control.paused and not self.monitor.fenced:
                    if self.claimer.worth_claiming(free):
                        claimed = self._start(
                            *await self.claimer.claim(
                                free,
                                self.control.paused_queues,
                                jobs_left=None if limit is None else limit - self._claimed_total,
                            )
                        )
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
        """Every claimed job becomes an attempt with its own task; its lease started after `sent`.
        Returns the slots taken: one per job, one per batch of a batch handler's jobs."""
        tracer = tracing.current_tracer()
        handlers = self.registry.handlers
        batched: list[ClaimedJob] = []
        for claimed in jobs:
            handler = handlers[claimed.type]
            if handler.batch_size is not None:
                batched.append(claimed)
                continue
            attempt = self._attempt(claimed, handler, sent)
            self.in_flight[claimed.id] = attempt
            self._running += 1
            self.executor.start(attempt, tracer)
            if self.observers.active:
                self.observers.claimed(claimed, max(0.0, time.time() - claimed.available_at.timestamp()))
        self._claimed_total += len(jobs)
        if batched:
            return len(jobs) - len(batched) + self._start_batches(batched, sent, tracer)
        return len(jobs)

    # -- batches ------------------------------------------------------------------------------------

    def _start_batches(self, jobs: list[ClaimedJob], sent: float, tracer: Tracer | None) -> int:
        """A batch handler's jobs, in claim order, split into batches of its `batch_size`, each taking one
        slot; a batch short of its size with a `batch_wait` claims again for the missing ones."""
        by_type: dict[str, list[ClaimedJob]] = {}
        for claimed in jobs:
            by_type.setdefault(claimed.type, []).append(claimed)
        batches = 0
        for job_type, of_type in by_type.items():
            handler = self.registry.handlers[job_type]
            size = handler.batch_size
            assert size is not None
            # Nothing of a job's own around the handler (no job scope or span): the batch runs in
            # one task, not one per job: a no-op batch handler's drain (5,000 jobs, batch 100, concurrency
            # 10; `python -m bench.gate --batch-size 100 --concurrency 10`) made 136.7 Python calls per job
            # with a task per job, 74.9 in one task per batch.
            whole = tracer is None and self.registry.job_scope is None
            for first in range(0, len(of_type), size):
                batch = BatchCall(
                    handler,
                    threads=self._threads,
                    start_timer=self.executor.start_timer,
                    release_slot=self._batch_slot_freed,
                    run=self.executor.run_batch if whole else None,
                    stop_alone=self.executor.stop_batched if whole else None,
                )
                self._running += 1
                self._in_batches -= 1
                batches += 1
                self._join(batch, of_type[first : first + size], sent, tracer)
                if batch.missing > 0 and handler.batch_wait > 0 and not self.stopping:
                    self._open_batches.add(batch)
                    gathering = self.claimer.gathering
                    gathering[job_type] = gathering.get(job_type, 0) + 1
                    gatherer = asyncio.create_task(self._gather(batch))
                    self._gatherers.add(gatherer)
                    gatherer.add_done_callback(self._gatherers.discard)
                else:
                    batch.close()
        return batches

    def _attempt(self, claimed: ClaimedJob, handler: Handler, sent: float) -> Attempt:
        """A claimed job's attempt, with the `JobExecution` its handler receives."""
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
            self.registry.build_job_spec,
            self.registry.keyring if self.settings.encryption_keys else None,
        )
        attempt.timeout = claimed.timeout_seconds or handler.timeout
        return attempt

    def _join(self, batch: BatchCall, jobs: list[ClaimedJob], sent: float, tracer: Tracer | None) -> None:
        """The jobs join the batch, each an attempt with its own task (that waits for the batch's call)."""
        handler = batch.handler
        whole = batch.whole  # run in one task: its jobs get no task of their own
        for claimed in jobs:
            attempt = self._attempt(claimed, handler, sent)
            batch.add(attempt)
            self._in_batches += 1
            self.in_flight[claimed.id] = attempt
            if not whole:
                self.executor.start(attempt, tracer)
            if self.observers.active:
                self.observers.claimed(claimed, max(0.0, time.time() - claimed.available_at.timestamp()))

    async def _gather(self, batch: BatchCall) -> None:
        """Claim for an open batch's missing jobs until it is full or its `batch_wait` passed: at each
        announcement of jobs of its type, and every tenth of its wait (at most a poll interval)."""
        wait = batch.handler.batch_wait
        deadline = batch.opened + wait
        pace = min(self.poll_interval, max(BATCH_POLL_SECONDS, wait / 10))
        try:
            while batch.missing > 0 and not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                batch.announced.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(batch.announced.wait(), min(left, pace))
                limit = self.options.job_limit
                wanted = batch.missing
                if limit is not None:
                    wanted = min(wanted, limit - self._claimed_total)
                if self.stopping or self.control.paused or self.monitor.fenced or wanted <= 0:
                    break
                jobs, sent = await self.claimer.claim_batch(batch.handler.type, wanted, self.control.paused_queues)
                if jobs:
                    self._claimed_total += len(jobs)
                    self._join(batch, jobs, sent, tracing.current_tracer())
        except Exception as exc:  # a claim that failed: the batch goes with what it has
            logger.warning(
                "batch of %s: claiming more jobs for it failed (%s); it runs with the %d it has",
                batch.handler.type,
                exc,
                len(batch.members),
                extra={"job_type": batch.handler.type, "worker_id": self.worker_id},
            )
        finally:
            self._open_batches.discard(batch)
            gathering = self.claimer.gathering
            job_type = batch.handler.type
            gathering[job_type] -= 1
            if not gathering[job_type]:
                del gathering[job_type]
            batch.close()
            self._wake.set()  # its type is claimed by the loop again

    def _batch_slot_freed(self, batch: BatchCall) -> None:
        self._running -= 1
        self._in_batches += 1
        self._wake.set()

    def _batch_slots_freed(self, attempts: list[Attempt]) -> None:
        """`_slot_freed` of jobs of one batch (run in one task) whose handler part ended together."""
        if not attempts:
            return
        batch = attempts[0].batch
        assert batch is not None
        self._in_batches -= len(attempts)
        batch.members_done(len(attempts))  # the batch's slot is freed with its last job
        if self._check_memory is not None:
            self._check_memory()

    def _slot_freed(self, attempt: Attempt) -> None:
        if attempt.batch is not None:
            self._in_batches -= 1
            attempt.batch.member_done()  # the batch's slot is freed with its last job
            if self._check_memory is not None:
                self._check_memory()
            return
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
            if attempt.batch is not None:
                self._in_batches -= 1
                attempt.batch.member_done()
            else:
                self._running -= 1
        self.in_flight.pop(attempt.id, None)
        if status is JobStatus.QUEUED:  # retried or released: claimable here again, maybe at once
            self.claimer.serves(attempt.claimed.queue, attempt.claimed.type)
        if status is JobStatus.COMPLETED:
            self.completed += 1
        elif status is JobStatus.FAILED:
            self.failed += 1
        self._wake.set()
