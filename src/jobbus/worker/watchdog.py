"""The loop-lag watchdog: notices an event loop blocked by a handler and names the job.

A blocking call inside an `async def` handler (`time.sleep`, a sync HTTP client, a CPU-bound loop)
stops every other job of the worker, its lease renewals and its registry refresh: if the loop stays
blocked longer than the worker's dead-after time, the worker is treated as dead and its jobs run
elsewhere. A thread checks that the loop keeps ticking; when it does not, it reads the loop thread's
stack to find the handler responsible and logs its job id and type, once when the stall is noticed
and once when it ends. When the thread itself was not scheduled for a while, the whole process was
frozen (SIGSTOP, a VM pause): it tells the lease monitor at once, so that handlers whose leases
expired meanwhile learn it before they go on (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType

from jobbus.worker.attempt import Attempt

logger = logging.getLogger("jobbus.worker")

#: How often the loop ticks and the thread looks.
TICK_SECONDS = 0.1
#: A loop that has not ticked for this long is reported as blocked.
BLOCKED_AFTER_SECONDS = 1.0
#: The thread itself waking this much later than asked means the process was frozen.
FROZEN_AFTER_SECONDS = 1.0


class LoopWatchdog:
    def __init__(
        self,
        attempts: Callable[[], Iterable[Attempt]],
        worker_id: str,
        *,
        on_freeze: Callable[[], None] | None = None,
    ) -> None:
        self._attempts = attempts
        self.worker_id = worker_id
        self._on_freeze = on_freeze
        self._last_tick = time.monotonic()
        self._stopped = threading.Event()
        self._handle: asyncio.TimerHandle | None = None
        self._loop_thread = 0
        self._thread: threading.Thread | None = None
        #: Stalls noticed so far (for tests and diagnostics).
        self.stalls = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="jobbus-loop-watchdog", daemon=True)
        self._thread.start()

    @property
    def last_tick(self) -> float:
        """Monotonic time of the event loop's last tick (the health endpoints read it from their thread)."""
        return self._last_tick

    def stop(self) -> None:
        self._stopped.set()
        if self._handle is not None:
            self._handle.cancel()

    def _tick(self) -> None:
        self._last_tick = time.monotonic()
        if not self._stopped.is_set():
            self._handle = self._loop.call_later(TICK_SECONDS, self._tick)

    def _watch(self) -> None:
        blocked_since: float | None = None
        looked = time.monotonic()
        while not self._stopped.wait(TICK_SECONDS):
            now = time.monotonic()
            if now - looked > TICK_SECONDS + FROZEN_AFTER_SECONDS:
                # This thread was not scheduled either: the whole process was frozen (SIGSTOP, a VM
                # pause), not blocked by a handler. Its handlers are told before they go on.
                looked = now
                if self._on_freeze is not None:
                    self._on_freeze()
                continue
            looked = now
            lag = now - self._last_tick
            if lag > BLOCKED_AFTER_SECONDS and blocked_since is None:
                blocked_since = self._last_tick
                self.stalls += 1
                self._report(lag)
            elif lag <= BLOCKED_AFTER_SECONDS and blocked_since is not None:
                logger.warning(
                    "worker %s: the event loop ran again after being blocked for %.1f s",
                    self.worker_id,
                    self._last_tick - blocked_since,
                    extra={"worker_id": self.worker_id},
                )
                blocked_since = None

    def _report(self, lag: float) -> None:
        attempt = self._culprit()
        if attempt is None:
            logger.warning(
                "worker %s: the event loop is blocked (%.1f s so far) outside any job handler",
                self.worker_id,
                lag,
                extra={"worker_id": self.worker_id},
            )
            return
        logger.warning(
            "worker %s: the event loop is blocked (%.1f s so far) by job %s (type %s): a blocking call in an "
            "async handler stops every job of this worker and its lease renewals; make the handler a plain "
            "`def` (it then runs in a thread) or use `await asyncio.to_thread(...)` for the blocking part",
            self.worker_id,
            lag,
            attempt.id,
            attempt.claimed.type,
            extra=attempt.log_extra(self.worker_id),
        )

    def _culprit(self) -> Attempt | None:
        """The attempt whose handler the loop thread is executing now, read from its stack."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread)
        running = {a.id: a for a in self._attempts() if a.in_handler}
        while frame is not None:
            candidate = frame.f_locals.get("attempt") if frame.f_code.co_name == "_call_async" else None
            if isinstance(candidate, Attempt) and candidate.id in running:
                return candidate
            frame = frame.f_back
        return None
