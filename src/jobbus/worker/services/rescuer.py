"""The rescuer: takes back the jobs of workers that died, and of leases that expired.

- A worker whose registry row has been silent longer than its own `worker_dead_after_seconds`
  (default 15 s) is declared dead and every job it started before that instant is taken back at
  once, in the same statement, long before the leases expire: a worker killed with a new id each
  time (a pod, an autoscaled instance) costs its jobs seconds, not `lease_seconds`. Such a worker
  fenced itself before that point; one that comes back keeps whatever it claims afterwards.
- A lease that expired (a hung or partitioned worker that still refreshes its row, a worker whose row
  was forgotten) is taken back too.
- A queued job past its `expires_at` that no claim met (claims cancel those they meet) is cancelled.

Taken back means `queued` again with the attempt counted, `failed` when that was the last attempt,
`cancelled` when cancellation was asked for; listeners of this process hear of each.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from jobbus.events import EventHub
from jobbus.store import DeadWorker, JobStore, RecoveredJob, Statement, WorkerStore
from jobbus.worker.recovery import announce_recovered

logger = logging.getLogger("jobbus.worker")

#: Leases recovered per statement; the rescuer loops until a batch comes back short.
BATCH = 1000


class Rescuer:
    name = "rescuer"

    def __init__(
        self,
        *,
        jobs: JobStore,
        workers: WorkerStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        events: EventHub,
        interval: float,
    ) -> None:
        self.jobs = jobs
        self.workers = workers
        self._run = run
        self.events = events
        self.interval = interval

    async def run_once(self) -> None:
        dead: list[DeadWorker] = await self._run(self.workers.declare_dead_workers())
        for worker in dead:
            logger.warning(
                "worker %s declared dead (silent for %.0f s): %d job(s) taken back",
                worker.worker_id,
                worker.silent_seconds,
                len(worker.recovered),
                extra={"worker_id": worker.worker_id},
            )
            await self._announce(worker.recovered)
        while True:
            expired: list[RecoveredJob] = await self._run(self.jobs.recover_expired_leases(BATCH))
            await self._announce(expired)
            if len(expired) < BATCH:
                break
        while True:
            cancelled: int = await self._run(self.jobs.cancel_expired_jobs(BATCH))
            if cancelled:
                logger.info("%d queued job(s) expired before they started: cancelled", cancelled)
            if cancelled < BATCH:
                return

    async def _announce(self, recovered: list[RecoveredJob]) -> None:
        for job in recovered:
            logger.warning(
                "job %s: taken back from its worker (%s); now %s",
                job.job_id,
                job.error,
                job.status.value,
                extra={"job_id": str(job.job_id), "job_type": job.type, "attempt": job.attempts},
            )
        await announce_recovered(self.events, recovered)
