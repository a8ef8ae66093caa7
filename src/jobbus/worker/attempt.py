"""`Attempt`: one in-flight attempt, from its claim until its outcome is durable and its scope exited."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from jobbus.execution import AttemptSignals, JobExecution, StopReason
from jobbus.models import ClaimedJob
from jobbus.registry import Handler


class Phase(enum.Enum):
    #: The handler runs (or its thread does): the attempt holds a concurrency slot and a renewed lease.
    RUNNING = "running"
    #: The handler is done; the outcome is being written. No slot, no lease renewal.
    WRITING = "writing"


@dataclass(eq=False, slots=True, weakref_slot=True)
class Attempt:
    claimed: ClaimedJob
    handler: Handler
    signals: AttemptSignals
    #: Monotonic time after which the lease has surely expired (from the send time of the last renewal).
    lease_deadline: float
    #: What the handler sees; set right after the attempt is made (its calls are run for this attempt).
    execution: JobExecution = field(init=False, repr=False)
    started: float = field(default_factory=time.monotonic)
    #: How long the handler ran, once it returned or raised.
    ran_seconds: float = 0.0
    phase: Phase = Phase.RUNNING
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    #: True while the handler's own code runs in the job task (async handlers): only then may the
    #: worker cancel the task, and a CancelledError it did not cause is the handler's own failure.
    in_handler: bool = False
    #: The reason the worker cancelled the handler's task, if it did.
    cancelled_for: StopReason | None = None
    #: Seconds the handler may run; None: no limit.
    timeout: float | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    #: The lease monitor has interrupted this attempt for a lost lease / for the worker's fence (the
    #: signals alone do not say: the watchdog's thread may set them first, after a freeze).
    lost: bool = False
    fenced: bool = False
    #: When a cancellation was seen: cancels an async handler's task at the end of its grace.
    cancel_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    #: The batch this attempt's job belongs to (a batch handler's); None for a handler of one job.
    batch: Batch | None = field(default=None, repr=False)

    @property
    def id(self) -> Any:
        return self.claimed.id

    @property
    def holds_slot(self) -> bool:
        return self.phase is Phase.RUNNING

    def interrupt(self, reason: StopReason, *, grace: float = 0.0) -> None:
        """Tell the handler to stop; an async handler's task is also cancelled, after `grace` seconds
        in which a cooperative handler can see `cancellation_requested` and return (a thread cannot be
        cancelled at all)."""
        self.signals.request(reason)
        if grace > 0:
            asyncio.get_running_loop().call_later(grace, self._cancel_task, reason)
        else:
            self._cancel_task(reason)

    def cancel_requested(self, grace: float | None, requested_ago: float = 0.0) -> None:
        """`cancel()` was called `requested_ago` seconds ago: the handler sees `cancellation_requested`
        and may return on its own (cooperative first); an async handler still running `grace` seconds
        after the request has its task cancelled (at once when the worker learnt of it later than
        that; None: never). A thread cannot be cancelled: a sync handler runs until it returns. Either
        way the attempt ends as `cancelled`. Seen again later, nothing new happens."""
        self.signals.request(StopReason.CANCELLED)
        if grace is None or self.cancel_timer is not None or not self.handler.is_async:
            return
        delay = max(0.0, grace - requested_ago)
        self.cancel_timer = asyncio.get_running_loop().call_later(delay, self._cancel_task, StopReason.CANCELLED)

    def stop_timers(self) -> None:
        """The handler is done: nothing is cancelled or timed out any more."""
        for timer in (self.timer, self.cancel_timer):
            if timer is not None:
                timer.cancel()

    def _cancel_task(self, reason: StopReason) -> None:
        if (
            self.handler.is_async
            and self.in_handler
            and self.cancelled_for is None
            and self.task is not None
            and not self.task.done()
        ):
            self.cancelled_for = reason
            self.task.cancel()
        elif (
            self.task is None and self.batch is not None and self.handler.is_async and self.in_handler
        ) and self.cancelled_for is None:  # a job of a batch run in one task (no task of its own)
            self.cancelled_for = reason
            self.batch.stop_alone(self)

    def log_extra(self, worker_id: str) -> dict[str, Any]:
        """Structured fields of a log line about this attempt; built only when a line is written."""
        return {
            "job_id": str(self.claimed.id),
            "job_type": self.claimed.type,
            "attempt": self.claimed.attempts,
            "worker_id": worker_id,
        }


@dataclass(frozen=True, slots=True)
class Answer:
    """What a batch handler's call answered for one job: its item (the job's result), or the exception
    that fails it."""

    item: Any = None
    raised: BaseException | None = None


class Batch(Protocol):
    """The batch of a batch handler's job (`worker/batches.py`), as its attempt sees it."""

    def arrive(self, attempt: Attempt) -> asyncio.Future[Answer]:
        """The attempt waits for the batch's call: its answer comes in the future returned."""
        ...

    def withdraw(self, attempt: Attempt) -> None:
        """The attempt ended before the call."""
        ...

    def member_done(self) -> None:
        """The attempt's handler part is over."""
        ...

    def members_done(self, count: int) -> None:
        """The handler part of `count` of its attempts is over."""
        ...

    def ended_alone(self) -> None:
        """An attempt stopped waiting for the call (the worker cancelled it)."""
        ...

    def stop_alone(self, attempt: Attempt) -> None:
        """The worker interrupted the attempt, a job of a batch run in one task: it ends alone now."""
        ...
