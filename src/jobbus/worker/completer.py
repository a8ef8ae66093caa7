"""The batched completer: outcomes of many jobs written in one fenced statement.

Job tasks hand in their outcome and wait for it to be durable. While one write is in flight, the
outcomes of other jobs accumulate and go out together in the next statement, so under load there
is one commit for many jobs and when idle a single outcome is written at once (no timer to wait
for). The backlog is bounded by the worker's concurrency: a job's slot is freed only after its
outcome is written. Each outcome is fenced by its own lease token; a stale token is reported back
as a lost lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from jobbus.store import JobStore, Outcome, Statement
from jobbus.worker.resilience import TRANSIENT_ERRORS, Backoff, Outage

logger = logging.getLogger("jobbus.worker")

MAX_BATCH = 500


@dataclass(slots=True)
class _Pending:
    outcome: Outcome
    lease_deadline: float  # monotonic: after this the lease is surely gone
    done: asyncio.Future[bool] = field(repr=False)


class Completer:
    def __init__(self, store: JobStore, run: Callable[[Statement[set[uuid.UUID]]], Awaitable[set[uuid.UUID]]]):
        self._store = store
        self._run = run
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._closing = False
        self._outage = Outage("completer")
        self._task: asyncio.Task[None] | None = None
        self.batches = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="jobbus-completer")

    async def write(self, outcome: Outcome, lease_deadline: float) -> bool:
        """Wait until the outcome is durable: True if applied, False if the lease was lost."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(outcome, lease_deadline, done))
        self._wakeup.set()
        return await asyncio.shield(done)

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                await self._flush(batch)
            if self._closing:
                return

    async def _flush(self, batch: list[_Pending]) -> None:
        backoff = Backoff()
        while batch:
            try:
                applied = await self._run(self._store.record_outcomes([p.outcome for p in batch]))
            except TRANSIENT_ERRORS as exc:
                self._outage.failed(exc)
                now = time.monotonic()
                for expired in [p for p in batch if p.lease_deadline <= now]:
                    if not expired.done.done():
                        expired.done.set_result(False)
                batch = [p for p in batch if p.lease_deadline > now]
                await asyncio.sleep(backoff.next_delay())
                continue
            except Exception as exc:  # a bug or a constraint: fail these writes loudly, keep the worker
                logger.exception("writing %d job outcome(s) failed", len(batch))
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                return
            self._outage.recovered()
            self.batches += 1
            for p in batch:
                if not p.done.done():
                    p.done.set_result(p.outcome.job_id in applied)
            return
