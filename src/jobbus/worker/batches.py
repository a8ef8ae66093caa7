"""Batch handlers: one call of a batch handler over jobs of its type claimed together.

A batch is a view over the claim, not a second claim path: its jobs are claimed by the claim statement
every job goes through, each becomes an attempt as any job does (its own task, lease, renewal,
cancellation, timeout and fenced outcome write), and the batch only decides when the handler is called
and hands each attempt its answer. The batch holds one of the worker's slots from its claim until its
last job's handler part is over.

An attempt reaches the call (`arrive`) or ends before it (`withdraw`: undecodable, its scope failed,
its claim answered too late). Once the batch is closed (full, or `batch_wait` passed) and every attempt
arrived or withdrew, the handler is called once with the `JobBatch` of the arrived ones still waiting.
Each attempt then gets its answer: the item of the list returned for it, or the exception raised. An
attempt stopped on its own meanwhile (its timeout, a cancellation past its grace, a lost lease, a
shutdown) ends alone and its item is ignored; once every attempt of the call has ended so, an async
call is cancelled.

A batch whose jobs need nothing of their own around the call (no job scope, no tracer) runs whole
in one task instead (`run`, the executor's `run_batch`): its attempts have no task
of their own, they wait for the call from their claim, and one interrupted by the worker ends alone
through `stop_alone`; the guarantees are the same.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from jobbus.execution import JobBatch, SyncJobExecution, enter_batch, leave_batch
from jobbus.registry import Handler
from jobbus.worker.attempt import Answer, Attempt

logger = logging.getLogger("jobbus.worker")


class BatchResultError(TypeError):
    """A batch handler returned something other than None or a list of one item per job."""


class BatchCall:
    """The jobs of one call of a batch handler, from the claim of its first job to the call's answers."""

    def __init__(
        self,
        handler: Handler,
        *,
        threads: ThreadPoolExecutor,
        start_timer: Callable[[Attempt], None],
        release_slot: Callable[[BatchCall], None],
        run: Callable[[BatchCall], Coroutine[Any, Any, None]] | None = None,
        stop_alone: Callable[[BatchCall, Attempt], None] | None = None,
    ) -> None:
        assert handler.batch_size is not None
        self.handler = handler
        self._loop = asyncio.get_running_loop()
        self.size = handler.batch_size
        self._threads = threads
        self._start_timer = start_timer
        self._release_slot = release_slot
        #: The batch's attempts, in claim order.
        self.members: list[Attempt] = []
        #: Still taking jobs: short of `size` and within `batch_wait` of its first job.
        self.open = True
        self.opened = time.monotonic()
        #: Set when jobs of its type were announced: the batch claims again for its missing ones.
        self.announced = asyncio.Event()
        self._holding = 0  # attempts whose handler part is not over (phase RUNNING)
        self._pending = 0  # attempts that neither arrived at the call nor withdrew from it
        self._arrived: dict[Attempt, asyncio.Future[Answer]] = {}
        self._withdrawn: set[Attempt] = set()
        self._holds_slot = True
        self._called = False
        self._answers: list[asyncio.Future[Answer]] = []
        self._answered = False  # the call returned or raised: its answers are being given
        self._abandoned = False
        self.call: asyncio.Task[None] | None = None
        #: Run in one task (`run`): its jobs have no task of their own; an interrupted one ends alone
        #: through `stop_alone`, while the task is in the handler's call (`calling`) or waits for it.
        self._run_whole = run
        self._stop_alone = stop_alone
        self.calling = False
        self.abandoned = False

    @property
    def whole(self) -> bool:
        """Whether the batch runs in one task (its jobs have no task of their own)."""
        return self._run_whole is not None

    @property
    def missing(self) -> int:
        return self.size - len(self.members)

    def add(self, attempt: Attempt) -> None:
        """A claimed job joins the batch (before its attempt starts)."""
        attempt.batch = self
        self.members.append(attempt)
        self._holding += 1
        if self._run_whole is not None:
            attempt.in_handler = True  # waits for the call: an interruption ends it alone (`stop_alone`)
            return
        self._pending += 1

    def close(self) -> None:
        """Take no more jobs: the call starts once every attempt arrived or withdrew."""
        if self.open:
            self.open = False
            self._maybe_call()
            self._maybe_release()

    # -- what the attempts tell it ------------------------------------------------------------------

    def arrive(self, attempt: Attempt) -> asyncio.Future[Answer]:
        """The attempt waits for the call: its answer comes in the future returned."""
        answer: asyncio.Future[Answer] = self._loop.create_future()
        self._arrived[attempt] = answer
        self._pending -= 1
        self._maybe_call()
        return answer

    def withdraw(self, attempt: Attempt) -> None:
        """The attempt ended before the call (its outcome was decided without the handler)."""
        if attempt in self._arrived or attempt in self._withdrawn:
            return
        self._withdrawn.add(attempt)
        self._pending -= 1
        self._maybe_call()

    def member_done(self) -> None:
        """An attempt's handler part is over: the slot is freed with the last one, once the batch is closed."""
        self._holding -= 1
        self._maybe_release()

    def members_done(self, count: int) -> None:
        """`member_done` of `count` attempts at once."""
        self._holding -= count
        self._maybe_release()

    def _maybe_release(self) -> None:
        if not self.open and self._holding <= 0 and self._holds_slot:
            self._holds_slot = False
            self._forget_members()
            self._release_slot(self)

    def _forget_members(self) -> None:
        """Every handler part is over: nothing reads the members again. The batch and its attempts refer
        to each other, so keeping them would leave a batch's attempts to the cyclic garbage collector
        instead of reference counting: a no-op batch handler's drain (100,000 jobs, batch 100,
        concurrency 50) spent a third of its worker's CPU in that collector."""
        self.members = []
        self._arrived = {}
        self._withdrawn = set()

    # -- the call -----------------------------------------------------------------------------------

    def _maybe_call(self) -> None:
        if self.open or self._pending > 0 or self._called:
            return
        self._called = True
        if self._run_whole is not None:
            self.call = self._loop.create_task(self._run_whole(self))
            return
        waiting = [(attempt, self._arrived[attempt]) for attempt in self.members if attempt in self._arrived]
        waiting = [(attempt, answer) for attempt, answer in waiting if not answer.done()]
        if waiting:
            self._answers = [answer for _, answer in waiting]
            self.call = self._loop.create_task(self._run(waiting))

    async def _run(self, waiting: list[tuple[Attempt, asyncio.Future[Answer]]]) -> None:
        answers = self._answers
        if any(answer.done() for answer in answers):  # ended on its own since it arrived
            self.ended_alone()
        for attempt, _ in waiting:
            self._start_timer(attempt)
        attempts = [attempt for attempt, _ in waiting]
        try:
            result = await self._call_handler(attempts)
        except asyncio.CancelledError as exc:
            if self._abandoned:
                return  # every job of the call ended on its own
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # cancelled from outside the worker: the host is tearing the loop down
            self._answer_all(answers, Answer(raised=exc))  # the handler's own CancelledError
            return
        except BaseException as exc:
            self._answer_all(answers, Answer(raised=exc))
            return
        self._answered = True
        for answer, item in zip(answers, self.answers(result, len(answers)), strict=True):
            if not answer.done():
                answer.set_result(item)

    def answers(self, result: Any, count: int) -> list[Answer]:
        """Each job's answer from what the call of `count` jobs returned (in batch order)."""
        if result is None:
            return [_COMPLETED] * count
        if not isinstance(result, list | tuple) or len(result) != count:
            got = f"a list of {len(result)} items" if isinstance(result, list | tuple) else type(result).__name__
            error = BatchResultError(
                f"batch handler {self.handler.type!r} returned {got} for a batch of {count} jobs: return "
                "None or a list with one item per job, in batch order"
            )
            return [Answer(raised=error)] * count
        return [Answer(raised=item) if isinstance(item, Exception) else Answer(item=item) for item in result]

    def stop_alone(self, attempt: Attempt) -> None:
        """An interrupted job of a batch run in one task ends alone; once none of the call's jobs waits
        for it, an async call is cancelled."""
        assert self._stop_alone is not None
        self._stop_alone(self, attempt)
        if self.calling and self.handler.is_async and not any(member.in_handler for member in self.members):
            self.abandoned = True
            assert self.call is not None
            self.call.cancel()

    async def call_handler(self, attempts: list[Attempt]) -> Any:
        """The handler's one call with the `JobBatch` of `attempts`: awaited, or run in a worker thread."""
        return await self._call_handler(attempts)

    async def _call_handler(self, attempts: list[Attempt]) -> Any:
        """What the call logs, other than through one job's `logger`, is kept with each of its jobs."""
        func = self.handler.func
        executions = [attempt.execution for attempt in attempts]
        token = enter_batch(executions)
        try:
            if self.handler.is_async:
                return await func(JobBatch(executions))
            loop = asyncio.get_running_loop()
            batch = JobBatch([SyncJobExecution(execution, loop) for execution in executions])
            # In a copy of the task's context, as asyncio.to_thread does.
            context = contextvars.copy_context()
            outcome: _Returned = await loop.run_in_executor(self._threads, context.run, _in_thread, func, batch)
        finally:
            leave_batch(token)
        if outcome.raised is not None:
            raise outcome.raised
        return outcome.value

    def _answer_all(self, answers: list[asyncio.Future[Answer]], answer: Answer) -> None:
        self._answered = True
        for future in answers:
            if not future.done():
                future.set_result(answer)

    def ended_alone(self) -> None:
        """An attempt stopped waiting for its answer (its timeout, a cancellation past its grace, a lost
        lease, a shutdown): once none of the call's attempts waits, an async call is cancelled."""
        call = self.call
        if call is None or call.done() or not self.handler.is_async or self._answered:
            return
        if all(answer.done() for answer in self._answers):
            self._abandoned = True
            call.cancel()


#: The answer of every job of a call that returned None.
_COMPLETED = Answer()


@dataclass(frozen=True, slots=True)
class _Returned:
    value: Any = None
    raised: BaseException | None = None


def _in_thread(func: Callable[[JobBatch[SyncJobExecution]], Any], batch: JobBatch[SyncJobExecution]) -> _Returned:
    """A sync batch handler's call in a worker thread; what it raised comes back as data (a
    `BaseException` re-raised through the event loop would be mistaken for the loop's own)."""
    try:
        return _Returned(func(batch))
    except BaseException as exc:
        return _Returned(raised=exc)
