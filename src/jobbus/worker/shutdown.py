"""The shutdown of the jobs in flight, once the claim loop has ended (a signal, a stop or restart
command, the memory limit, a fatal error).

In-flight jobs get `--shutdown-timeout` to finish; then their handlers are asked to stop
(`cancellation_requested`) and get COOPERATIVE_GRACE_SECONDS more; then async handlers are
cancelled and their jobs released: `queued` again, available at once, not counted as a failure.
Sync handlers run in threads, which cannot be interrupted: their jobs keep their leases until the
process exits, then they are recovered. A second signal (`hurry`) skips the waits for handlers; the
releases still get RELEASE_HURRY_SECONDS to be written.
"""

from __future__ import annotations

import logging
import time

from jobbus.execution import StopReason
from jobbus.worker.attempt import Attempt, Phase
from jobbus.worker.producer import Producer

logger = logging.getLogger("jobbus.worker")

#: After the shutdown timeout, handlers get min(this, --shutdown-timeout) to honour `cancellation_requested`.
COOPERATIVE_GRACE_SECONDS = 3.0
#: After async handlers are cancelled at shutdown, how long their releases may take to be written
#: (after a second signal, or a fatal error: RELEASE_HURRY_SECONDS).
RELEASE_WAIT_SECONDS = 10.0
RELEASE_HURRY_SECONDS = 2.0


class Shutdown:
    def __init__(self, producer: Producer, *, timeout: float, worker_id: str) -> None:
        self._producer = producer
        self.timeout = timeout
        self.worker_id = worker_id
        #: Skip every remaining wait for handlers (a second signal, a fatal error).
        self.hurry = False

    async def run(self) -> None:
        """The whole sequence; it returns once every job has ended, or was left to a thread that runs on."""
        if not self._producer.in_flight:
            return
        if not self.hurry:
            await self._wait_in_flight(self.timeout)
        running = self._running_attempts()
        if running:
            logger.warning("asking %d unfinished job(s) to stop", len(running))
            for attempt in running:
                attempt.signals.request(StopReason.SHUTDOWN)
            if not self.hurry:
                await self._wait_in_flight(min(COOPERATIVE_GRACE_SECONDS, self.timeout or 0.5))
        running = self._running_attempts()
        if running:
            logger.warning("interrupting %d unfinished job(s) to release them", len(running))
            for attempt in running:
                attempt.interrupt(StopReason.SHUTDOWN)
        await self._wait_in_flight(RELEASE_HURRY_SECONDS if self.hurry else RELEASE_WAIT_SECONDS, releases=True)
        # Each job is named once: "released at shutdown" when its release is written (`Producer._finished`),
        # else here, by what still holds it.
        for attempt in self._running_attempts():
            where = "sync handlers run in threads, which cannot be interrupted"
            if attempt.handler.is_async:
                where = "its handler ignored the cancellation"
            logger.warning(
                "job %s did not end (%s): not released, it keeps its lease until this process exits, then it "
                "is recovered",
                attempt.id,
                where,
                extra=attempt.log_extra(self.worker_id),
            )
        for attempt in self._producer.in_flight.values():
            if attempt.phase is not Phase.RUNNING:
                logger.warning(
                    "job %s: its outcome was not confirmed written before shutdown; if it was not, the job is "
                    "recovered when its lease expires",
                    attempt.id,
                    extra=attempt.log_extra(self.worker_id),
                )

    def _running_attempts(self) -> list[Attempt]:
        return [a for a in self._producer.in_flight.values() if a.phase is Phase.RUNNING]

    async def _wait_in_flight(self, timeout: float, *, releases: bool = False) -> None:
        """Wait for in-flight jobs to end. A second signal cuts the wait for handlers short; the wait for
        releases is only shortened to RELEASE_HURRY_SECONDS."""
        deadline = time.monotonic() + timeout
        while self._producer.in_flight:
            if self.hurry:
                if not releases:
                    return
                deadline = min(deadline, time.monotonic() + RELEASE_HURRY_SECONDS)
                releases = False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await self._producer.wait_for_change(remaining)
