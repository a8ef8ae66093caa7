"""The batched completer: outcomes of many jobs written in one fenced statement.

Job tasks hand in their outcome and wait for it to be durable. While one write is in flight, the
outcomes of other jobs accumulate and go out together in the next statement, so under load there
is one commit for many jobs and when idle a single outcome is written at once (no timer to wait
for). The backlog is bounded: the worker stops claiming while four outcomes per slot are waiting.
Each outcome is fenced by its own lease token; a stale token is reported back as a lost lease.

One bad row never takes the batch down: when the database refuses the batch for its data, the
outcomes are written one by one and a refused one is replaced by a non-retryable failure that says
why. The completer never dies: a fatal error is reported to the worker and the round's writes come
back "not applied" (those jobs are recovered when their leases expire).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from jobbus.models import JobStatus
from jobbus.resilience import Backoff, ErrorKind, Outage, classify
from jobbus.store import JobStore, Outcome, Statement
from jobbus.worker.outcomes import error_text
from jobbus.worker.service import Service

logger = logging.getLogger("jobbus.worker")


#: What became of each outcome of a round: job id → (the status written, None or the message of the
#: non-retryable failure written instead: the database refused the outcome). Missing: the lease was lost.
Written = dict[uuid.UUID, tuple[JobStatus, str | None]]


@dataclass(slots=True)
class _Round:
    """The outcomes handed in while the previous write was in flight; written together."""

    outcomes: list[Outcome] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)  # monotonic: after this the lease is surely gone
    #: What `write` callers wait on (made for the first of them).
    done: asyncio.Future[Written] | None = None
    #: What `submit` callers are called with, once the round's result is known.
    callbacks: list[Callable[[Written], None]] = field(default_factory=list)

    def settle(self, written: Written) -> None:
        """Tell every writer of the round what became of its outcome."""
        if self.done is not None and not self.done.done():
            self.done.set_result(written)
        for callback in self.callbacks:
            try:
                callback(written)
            except Exception:
                logger.exception("the bookkeeping after an outcome was written failed")
        self.callbacks = []


class Completer(Service):
    def __init__(
        self,
        store: JobStore,
        run: Callable[[Statement[dict[uuid.UUID, JobStatus]]], Awaitable[dict[uuid.UUID, JobStatus]]],
        *,
        write_lock: asyncio.Lock,
        on_fatal: Callable[[str, BaseException], None],
    ) -> None:
        self._store = store
        self._run = run
        self._write_lock = write_lock
        self._on_fatal = on_fatal
        self._round = _Round()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._outage = Outage("completer")

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"completer": self._loop()}

    async def write(self, outcome: Outcome, lease_deadline: float) -> tuple[JobStatus | None, str | None]:
        """Wait until the outcome is durable. Returns (status, refusal): the status written, which is
        `cancelled` whatever the outcome when the job's cancellation was asked for, or None when the lease
        was lost (or the completer stopped first); a refusal is the message of the non-retryable failure
        written instead of an outcome the database refused.

        Every outcome of a round waits on one shared future (one allocation per round, not per job);
        it is shielded, so a cancelled waiter never cancels the others' result.
        """
        if self._closing and all(task.done() for task in self._tasks):
            return None, None
        current = self._round
        if current.done is None:
            current.done = asyncio.get_running_loop().create_future()
        current.outcomes.append(outcome)
        current.deadlines.append(lease_deadline)
        self._wakeup.set()
        written = await asyncio.shield(current.done)
        return written.get(outcome.job_id, (None, None))

    def submit(self, outcome: Outcome, lease_deadline: float, on_written: Callable[[Written], None]) -> None:
        """Hand in an outcome without waiting for it: `on_written` is called with the round's result (as
        `write` reads it) once it is known. For the attempts that have nothing left to do after their
        outcome but the worker's bookkeeping, which then costs no wake-up of their task."""
        if self._closing and all(task.done() for task in self._tasks):
            on_written({})
            return
        current = self._round
        current.outcomes.append(outcome)
        current.deadlines.append(lease_deadline)
        current.callbacks.append(on_written)
        self._wakeup.set()

    def submit_many(
        self, outcomes: list[Outcome], lease_deadlines: list[float], on_written: Callable[[Written], None]
    ) -> None:
        """`submit` for the outcomes of a batch handler's call: handed in together, one callback for all."""
        if self._closing and all(task.done() for task in self._tasks):
            on_written({})
            return
        current = self._round
        current.outcomes.extend(outcomes)
        current.deadlines.extend(lease_deadlines)
        current.callbacks.append(on_written)
        self._wakeup.set()

    async def close(self, timeout: float) -> None:
        """Flush what is pending (at most `timeout` seconds), then stop."""
        self._closing = True
        self._wakeup.set()
        if not self._tasks:
            return
        await asyncio.wait(self._tasks, timeout=timeout)
        await super().close(1.0)
        self._round.settle({})

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._round.outcomes:
                current, self._round = self._round, _Round()
                try:
                    written = await self._flush(current.outcomes, current.deadlines)
                except BaseException:
                    current.settle({})  # cancelled at close: nothing is known to be written
                    raise
                current.settle(written)
            if self._closing:
                return

    async def _flush(self, outcomes: list[Outcome], deadlines: list[float]) -> Written:
        backoff = Backoff()
        while True:
            try:
                async with self._write_lock:
                    applied = await self._run(self._store.record_outcomes(outcomes))
            except Exception as exc:
                kind = classify(exc)
                if kind is ErrorKind.TRANSIENT:
                    self._outage.failed(exc)
                    now = time.monotonic()
                    live = [i for i, deadline in enumerate(deadlines) if deadline > now]
                    outcomes, deadlines = [outcomes[i] for i in live], [deadlines[i] for i in live]
                    if not outcomes:  # every lease is gone: the jobs will be recovered and run again
                        return {}
                    if self._closing and backoff.attempt >= 3:
                        return {}  # stopping: an outage does not hold the exit (the leases expire)
                    await asyncio.sleep(backoff.next_delay())
                    continue
                if kind is ErrorKind.DATA and len(outcomes) > 1:
                    return await self._one_by_one(outcomes)
                if kind is ErrorKind.DATA:
                    return await self._refused(outcomes[0], exc)
                self._on_fatal("completer", exc)
                return {}
            self._outage.recovered()
            return {job_id: (status, None) for job_id, status in applied.items()}

    async def _one_by_one(self, outcomes: list[Outcome]) -> Written:
        """The database refused the batch for its data: find the row, write every other one."""
        written: Written = {}
        for outcome in outcomes:
            written.update(await self._flush([outcome], [float("inf")]))
        return written

    async def _refused(self, outcome: Outcome, exc: BaseException) -> Written:
        """This one outcome cannot be stored: fail its job, non-retryably, saying why."""
        if outcome.status is JobStatus.FAILED and outcome.result_json is None:
            self._on_fatal("completer", exc)  # even a plain failure is refused: not a problem of this row
            return {}
        message = error_text(exc, f"its {outcome.status.value} outcome could not be stored: ")
        logger.error("job %s: %s", outcome.job_id, message, extra={"job_id": str(outcome.job_id)})
        failure = Outcome(outcome.job_id, outcome.lease_token, JobStatus.FAILED, error=message)
        return {
            job_id: (status, message) for job_id, (status, _) in (await self._flush([failure], [float("inf")])).items()
        }
