"""Registration: the worker id taken in the registry at start, taken again when its row is lost, refused
while a live process holds it.

One live process holds a worker id at a time. A holder on this host whose process is gone (a killed
worker restarted under the same id) is taken over at once instead of once its row goes silent; the
new instance then takes back what earlier processes under the id left running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from jobbus.errors import JobbusError
from jobbus.store import RecoveredJob, Registration, Statement, WorkerStore

logger = logging.getLogger("jobbus.worker")


class WorkerIdInUseError(JobbusError):
    """Another live process holds this worker id; the CLI exits 78."""


class Registrar:
    def __init__(
        self,
        registration: Registration,
        *,
        workers: WorkerStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        starting: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
        on_id_taken: Callable[[WorkerIdInUseError], None],
    ) -> None:
        self.registration = registration
        self.worker_id = registration.worker_id
        self.workers = workers
        self._run = run
        self._starting = starting
        self._on_id_taken = on_id_taken

    async def register(self) -> int:
        """Take the worker id, or raise `WorkerIdInUseError` while a live process holds it; returns the
        control generation the worker starts acknowledged at."""
        registration = self.registration
        acked: int | None = await self._starting(lambda: self._run(self.workers.register_worker(registration)))
        if acked is None:
            holder = await self._run(self.workers.worker_holding_id(self.worker_id))
            if holder is not None and holder.host == registration.host and not _process_alive(holder.pid):
                # The process that held the id on this host is gone (a restart of a killed worker):
                # take over now instead of waiting for its row to go silent.
                statement = self.workers.register_worker(registration, replaces=holder.instance_id)
                acked = await self._run(statement)
        if acked is None:
            raise await self._id_in_use()
        return acked

    async def reclaim_predecessor_jobs(self) -> list[RecoveredJob]:
        """Take back what earlier processes under this worker id left running (only jobs that started
        before this instance registered)."""
        recovered: list[RecoveredJob] = await self._starting(
            lambda: self._run(self.workers.reclaim_predecessor_jobs(self.worker_id, self.registration.instance_id))
        )
        if recovered:
            logger.warning(
                "worker %s reclaimed %d job(s) its previous run left running",
                self.worker_id,
                len(recovered),
                extra={"worker_id": self.worker_id},
            )
        return recovered

    async def register_again(self) -> None:
        """Our row is gone or belongs to another instance: register again, or report the id taken."""
        acked = await self._run(self.workers.register_worker(self.registration))
        if acked is None:
            self._on_id_taken(await self._id_in_use())
            return
        logger.warning("worker %s registered again (its registry row was gone)", self.worker_id)

    async def _id_in_use(self) -> WorkerIdInUseError:
        holder = await self._run(self.workers.worker_holding_id(self.worker_id))
        where = ""
        if holder is not None:
            where = (
                f" (host {holder.host}, pid {holder.pid}, seen {holder.seen_seconds_ago:.0f} s ago; it counts as "
                f"gone once silent for {holder.silent_after_seconds:g} s)"
            )
        return WorkerIdInUseError(
            f"worker id {self.worker_id!r} is in use by a live worker{where}: give every worker process its "
            f"own --worker-id, or start this one after the other stops"
        )


def _process_alive(pid: int) -> bool:
    """Whether a process of this host exists (a pid equal to ours is another, earlier process)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
