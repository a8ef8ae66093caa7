"""The claimer: what this worker may take, when to claim, and the claim itself.

A claim is one statement (`FOR UPDATE SKIP LOCKED` + `UPDATE ... RETURNING`) that leases up to the free
slots at once. With a backlog, a free slot waits a moment for others so claims go out in batches.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from jobbus.models import ClaimedJob
from jobbus.settings import Settings
from jobbus.store import JobStore, Statement

#: With a backlog, a free slot waits at most this long for others to free up before it is claimed
#: for. Claiming a quarter of the concurrency at once instead of one slot at a time measured +12%
#: drain rate at concurrency 200 (16.6k–17.1k against 14.9k–15.3k jobs/s, fresh 100k backlog).
CLAIM_BATCH_WAIT_SECONDS = 0.02


class Claimer:
    def __init__(
        self,
        *,
        store: JobStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        settings: Settings,
        worker_id: str,
        types: Sequence[str],
        queues: Sequence[str] | None,
        concurrency: int,
    ) -> None:
        self.store = store
        self._run = run
        self.settings = settings
        self.worker_id = worker_id
        self.types = list(types)
        self.queues = list(queues) if queues is not None else None
        self._served = frozenset(self.queues) if self.queues is not None else None
        #: With a backlog, claim when this many slots are free (or CLAIM_BATCH_WAIT_SECONDS passed).
        self._batch = max(1, concurrency // 4)
        self.backlog = False
        self._last_claim = 0.0

    def serves(self, queue: str | None) -> bool:
        """Whether a notification about `queue` (None: unknown) concerns this worker."""
        return queue is None or self._served is None or queue in self._served

    def worth_claiming(self, free: int) -> bool:
        """With a backlog, wait for a batch of free slots rather than claim one slot at a time."""
        waited = time.monotonic() - self._last_claim
        return not self.backlog or free >= self._batch or waited >= CLAIM_BATCH_WAIT_SECONDS

    async def claim(self, free: int, paused_queues: frozenset[str]) -> tuple[list[ClaimedJob], float]:
        """Lease up to `free` jobs; returns them with the claim's send time (their leases started later)."""
        sent = time.monotonic()
        jobs: list[ClaimedJob] = await self._run(
            self.store.claim_jobs(
                worker_id=self.worker_id,
                limit=free,
                types=self.types,
                queues=self.queues,
                paused_queues=sorted(paused_queues),
                lease_seconds=self.settings.lease_seconds,
                max_payload_bytes=self.settings.max_payload_bytes,
            )
        )
        self._last_claim = time.monotonic()
        self.backlog = len(jobs) == free
        return jobs, sent
