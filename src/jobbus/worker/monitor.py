"""The monitor: keeps the worker's leases and registry row alive, and fences the worker when it cannot.

Three loops:
- `leases` (every heartbeat interval): renews the leases of every running handler in one statement
  and refreshes their cancellation flags: a cancelled handler is told, and an async one still
  running `cancel_grace_seconds` after the request has its task cancelled.
- `registry` (every heartbeat interval): refreshes the worker's registry row. Separate from the
  leases, so a job row someone holds locked delays that job's renewal, not the worker's liveness.
- `watch` (several times a second, no database): a handler whose lease has surely expired is told so
  (`lease_lost`); when the registry row could not be refreshed for `fence_after_seconds`, every
  running handler is fenced, before the leader may declare the worker dead and recover its jobs.
  After a freeze of the whole process (noticed by the loop watchdog's thread, `after_freeze`), both
  happen at once and async handlers are cancelled without grace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from jobbus.execution import StopReason
from jobbus.resilience import Backoff, Outage, is_transient
from jobbus.settings import Settings
from jobbus.store import JobStore, Statement
from jobbus.worker.attempt import Attempt, Phase
from jobbus.worker.service import Service

logger = logging.getLogger("jobbus.worker")
T = TypeVar("T")

#: How often the watch loop compares deadlines with the clock.
WATCH_INTERVAL_SECONDS = 0.25
#: A handler told that its lease is lost (or that the worker is fenced) gets this long to see
#: `cancellation_requested` and return before its task is cancelled; after a freeze, none.
LOSS_GRACE_SECONDS = 0.5
#: A loop tick or watchdog look this much later than due means the process was frozen.
FREEZE_SECONDS = 1.0


class Monitor(Service):
    def __init__(
        self,
        *,
        settings: Settings,
        store: JobStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        attempts: Callable[[], Iterable[Attempt]],
        touch: Callable[[], Awaitable[bool | None]],
        write_lock: asyncio.Lock,
        worker_id: str,
        on_fatal: Callable[[str, BaseException], None],
        on_registration_lost: Callable[[], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self._fence_after = settings.fence_after_seconds  # read per attempt: a property computes it
        self.store = store
        self._run = run
        self._attempts = attempts
        self._touch = touch
        self._write_lock = write_lock
        self.worker_id = worker_id
        self._on_fatal = on_fatal
        self._on_registration_lost = on_registration_lost
        #: Monotonic send time of the last registry refresh that succeeded.
        self.last_contact = time.monotonic()
        self.fenced = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()  # `after_freeze` calls into it from the watchdog's thread
        super().start()

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {
            "leases": self._every_heartbeat("lease monitor", self._renew_leases),
            "registry": self._every_heartbeat("worker registry", self.refresh),
            "watch": self._watch_loop(),
        }

    # -- renewals -----------------------------------------------------------------------------------

    async def _every_heartbeat(self, component: str, call: Callable[[], Awaitable[None]]) -> None:
        """Every heartbeat interval; after a failure sooner (backoff), so a fence lifts quickly."""
        outage = Outage(component)
        backoff = Backoff(first=0.2, cap=self.settings.heartbeat_seconds)
        delay = self.settings.heartbeat_seconds
        while True:
            await asyncio.sleep(delay)
            try:
                await call()
            except Exception as exc:
                if not is_transient(exc):
                    self._on_fatal(component, exc)
                    return
                outage.failed(exc)
                delay = backoff.next_delay()
                continue
            outage.recovered()
            backoff.reset()
            delay = self.settings.heartbeat_seconds

    async def refresh(self) -> None:
        """Refresh the registry row; the fence lifts once it is refreshed again."""
        sent = time.monotonic()
        declared_dead = await self._touch()
        if declared_dead is None:
            await self._on_registration_lost()
            return
        if declared_dead:
            # The leader took back what this worker had started before declaring it dead, and nothing
            # it claimed since: a renewal now tells which attempts are over.
            await self._renew_leases()
        self.last_contact = sent
        if self.fenced:
            logger.warning("worker %s reached the database again: claiming again", self.worker_id)
            self.fenced = False

    async def _renew_leases(self) -> None:
        # Only running handlers: a finished job's outcome is being written by the completer.
        attempts = {a.id: a for a in self._attempts() if a.phase is Phase.RUNNING and not a.signals.lease_lost}
        if not attempts:
            return
        sent = time.monotonic()
        async with self._write_lock:  # never concurrently with an outcome batch: the two cannot deadlock
            live = await self._run(
                self.store.heartbeat_leases(
                    {job_id: a.claimed.lease_token for job_id, a in attempts.items()}, self.settings.lease_seconds
                )
            )
        for job_id, attempt in attempts.items():
            if job_id in live:
                attempt.lease_deadline = sent + self.settings.lease_seconds
                requested_ago = live[job_id]
                if requested_ago is not None:
                    attempt.cancel_requested(self.settings.cancel_grace_seconds, requested_ago)
            elif attempt.phase is Phase.RUNNING:
                # Once the handler returned, a missing lease means its outcome was written meanwhile.
                self._lose(attempt, "expired or taken over")

    def _lose(self, attempt: Attempt, why: str, grace: float = LOSS_GRACE_SECONDS) -> None:
        if attempt.lost:
            return
        attempt.lost = True
        attempt.interrupt(StopReason.LEASE_LOST, grace=grace)
        logger.warning(
            "job %s: lease lost during attempt %d (%s); its outcome is not written",
            attempt.id,
            attempt.claimed.attempts,
            why,
            extra=attempt.log_extra(self.worker_id),
        )

    # -- deadlines ----------------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_INTERVAL_SECONDS)
            now = time.monotonic()
            # Much later than asked: the process was stopped (SIGSTOP, a VM pause) or starved.
            self.check_deadlines(grace=0.0 if now - last > WATCH_INTERVAL_SECONDS + FREEZE_SECONDS else None)
            last = now

    def after_freeze(self) -> None:
        """Called from the loop watchdog's thread when that thread itself was not scheduled for a while:
        the process was frozen (SIGSTOP, a VM pause), and handlers are resuming beside their re-runs on
        other workers. Every running handler whose lease expired meanwhile, or of a worker silent long
        enough to be fenced, is told at once, before the loop gets to it (a sync handler sees
        `cancellation_requested` and `lease_lost` at its next look); the loop then cancels the async
        ones without grace. Signals only, from this thread: the loop does the rest."""
        now = time.monotonic()
        fenced = now - self.last_contact >= self.settings.fence_after_seconds
        try:
            attempts = list(self._attempts())
        except RuntimeError:  # changed under us by the loop: the loop's own check below covers it
            attempts = []
        for attempt in attempts:
            if attempt.phase is Phase.RUNNING and (fenced or now > attempt.lease_deadline):
                attempt.signals.request(StopReason.FENCED if fenced else StopReason.LEASE_LOST)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.check_deadlines, 0.0)

    def check(self, attempt: Attempt) -> None:
        """Before an attempt's outcome is decided: a lease that surely expired, or a worker that was cut
        off long enough to be fenced (its loop may have been blocked meanwhile), is noted now."""
        now = time.monotonic()
        if now > attempt.lease_deadline:
            self._lose(attempt, "its lease expired before the handler returned")
        elif now - self.last_contact >= self._fence_after:
            attempt.signals.request(StopReason.FENCED)

    def check_deadlines(self, grace: float | None = None) -> None:
        """Handlers whose lease surely expired, or of a worker fenced for its silence, are told, and
        async ones cancelled after `grace` (None: LOSS_GRACE_SECONDS; 0 after a freeze: at once)."""
        grace = LOSS_GRACE_SECONDS if grace is None else grace
        now = time.monotonic()
        silent = now - self.last_contact
        if silent >= self.settings.fence_after_seconds:
            if not self.fenced:
                self.fenced = True
                logger.error(
                    "worker %s could not reach the database for %.1f s: fencing its running jobs (they may be "
                    "recovered by another worker); their handlers are asked to stop and their outcomes are "
                    "not written",
                    self.worker_id,
                    silent,
                    extra={"worker_id": self.worker_id},
                )
            for attempt in self._attempts():
                if attempt.phase is Phase.RUNNING and not attempt.fenced:
                    attempt.fenced = True
                    attempt.interrupt(StopReason.FENCED, grace=grace)
        for attempt in self._attempts():
            if attempt.phase is Phase.RUNNING and now > attempt.lease_deadline:
                self._lose(attempt, "its lease expired before it could be renewed", grace)
