"""The claimer: what this worker may take, when to claim, and the claim itself.

The worker keeps the (queue, type) pairs it can take that have queued jobs: read every poll interval
with one loose index scan (one probe per pair, whatever the jobs in it), and completed at once by job
notifications, which carry their queue and type. With them it reads which queues have limits (flow
control): only those are claimed through the limited path, within one poll interval of a change.

A claim is one statement that leases up to the free slots over those pairs, queue by queue (the order
rotates, so every queue gets its share first), and walks only rows it can take: paused queues, other
queues, unhandled types and jobs scheduled for later are never read. With a backlog, a free slot
waits a moment for others so claims go out in batches.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from jobbus.models import ClaimedJob
from jobbus.settings import Settings
from jobbus.store import Claim, JobStore, MaintenanceStore, Statement
from jobbus.store.queues import QueueStore

logger = logging.getLogger("jobbus.worker")

#: With a backlog, a free slot waits at most this long for others to free up before it is claimed
#: for. Claiming a quarter of the concurrency at once instead of one slot at a time measured +12%
#: drain rate at concurrency 200 (16.6k–17.1k against 14.9k–15.3k jobs/s, fresh 100k backlog).
CLAIM_BATCH_WAIT_SECONDS = 0.02
#: The shortest wait before claiming again from limited queues whose limits cut the last claim short.
LIMITED_POLL_SECONDS = 0.005
#: A claim for a batch handler's jobs of at least twice this many goes out as `CLAIM_PARTS` statements
#: in flight at once, each for whole batches: the database leases one part while the worker starts the
#: batches of another, instead of one statement's wait followed by the worker's. A no-op batch
#: handler's drain (100,000 jobs, batch 100, concurrency 50) measured 40.4k–40.9k against
#: 35.6k–36.3k jobs/s claimed in one statement; three parts measured no more than two.
CLAIM_PART_JOBS = 1000
CLAIM_PARTS = 2


class Claimer:
    def __init__(
        self,
        *,
        store: JobStore,
        maintenance: MaintenanceStore,
        queue_settings: QueueStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        settings: Settings,
        worker_id: str,
        types: Sequence[str],
        queues: Sequence[str] | None,
        concurrency: int,
        poll_interval: float,
        batch_sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.store = store
        self.maintenance = maintenance
        self.queue_settings = queue_settings
        self._run = run
        self.settings = settings
        self.worker_id = worker_id
        self.types = frozenset(types)
        self._served = frozenset(queues) if queues is not None else None
        self.poll_interval = poll_interval
        #: With a backlog, claim when this many slots are free (or CLAIM_BATCH_WAIT_SECONDS passed).
        self._batch = max(1, concurrency // 4)
        self.backlog = False
        #: The last claim came back short while limited queues were in it: limits, not an empty table.
        self.limited_short = False
        self._last_claim = 0.0
        #: The (queue, type) pairs this worker can take that held queued jobs when last looked at.
        self._pairs: dict[tuple[str, str], None] = {}
        self._pairs_read = float("-inf")
        #: While the pairs are being read: those notified meanwhile, which the read may not see.
        self._notified_during_read: set[tuple[str, str]] | None = None
        self._rotation = 0
        #: Queues with limits: claimed through take_limited. Read with the pairs.
        self._limited: frozenset[str] = frozenset()
        #: The last claim stopped at its expiry budget: expired jobs it cancelled may hide available ones.
        self.expired_ahead = False
        #: Whether the last claim read the pairs from the table (rather than from memory).
        self.read_fresh = False
        #: The batch handlers' types this worker takes, and their batch sizes: a slot claims a batch.
        self._batch_sizes = {t: n for t, n in (batch_sizes or {}).items() if t in self.types}
        self._group_rotation = 0
        #: Batch types with a batch still taking jobs (`batch_wait`): their jobs are left to it.
        self.gathering: dict[str, int] = {}

    def serves(self, queue: str | None, job_type: str | None) -> bool:
        """Whether a notification about (queue, type) concerns this worker (None: it does not say)."""
        if queue is None or job_type is None:
            self._pairs_read = float("-inf")  # look at the table again before the next claim
            return True
        if not self._takes(queue, job_type):
            return False
        self._pairs[(queue, job_type)] = None
        if self._notified_during_read is not None:
            self._notified_during_read.add((queue, job_type))
        return True

    def _takes(self, queue: str, job_type: str) -> bool:
        return job_type in self.types and (self._served is None or queue in self._served)

    def forget_pairs(self) -> None:
        """Read the pairs from the table before the next claim."""
        self._pairs_read = float("-inf")

    def worth_claiming(self, free: int) -> bool:
        """With a backlog, wait for a batch of free slots rather than claim one slot at a time."""
        waited = time.monotonic() - self._last_claim
        return not self.backlog or free >= self._batch or waited >= CLAIM_BATCH_WAIT_SECONDS

    async def _read_pairs(self) -> None:
        notified: set[tuple[str, str]] = set()
        self._notified_during_read = notified
        try:
            pairs = await self._run(self.maintenance.queued_pairs())
        finally:
            self._notified_during_read = None
        self._pairs = {pair: None for pair in pairs if self._takes(*pair)} | dict.fromkeys(notified)
        self._limited = frozenset(await self._run(self.queue_settings.limited_queues()))
        self._pairs_read = time.monotonic()

    async def claim(
        self, free: int, paused_queues: frozenset[str], *, jobs_left: int | None = None
    ) -> tuple[list[ClaimedJob], float]:
        """Lease up to `free` jobs, or, of a batch handler's type, up to `free` batches of them (at most
        `jobs_left` jobs in all); returns them with the claim's send time (their leases started later)."""
        self.read_fresh = time.monotonic() - self._pairs_read >= self.poll_interval
        if self.read_fresh:
            await self._read_pairs()
        pairs = self._serving_order([pair for pair in self._pairs if pair[0] not in paused_queues])
        sent = time.monotonic()
        if not pairs:
            self.expired_ahead = False
            self.backlog = False
            self.limited_short = False
            return [], sent
        if self._batch_sizes:
            return await self._claim_with_batches(free, pairs, jobs_left, sent), sent
        claim: Claim = await self._run(
            self.store.claim_jobs(
                worker_id=self.worker_id,
                limit=free,
                pairs=pairs,
                lease_seconds=self.settings.lease_seconds,
                max_payload_bytes=self.settings.max_payload_bytes,
                limited_queues=sorted(self._limited.intersection(queue for queue, _ in pairs)),
            )
        )
        jobs = claim.jobs
        self._last_claim = time.monotonic()
        self.expired_ahead = claim.expired_ahead
        self.backlog = len(jobs) == free
        self.limited_short = len(jobs) < free and bool(self._limited.intersection(q for q, _ in pairs))
        return jobs, sent

    async def _claim_with_batches(
        self, free: int, pairs: list[tuple[str, str]], jobs_left: int | None, sent: float
    ) -> list[ClaimedJob]:
        """A worker with batch handlers claims each batch type apart from the other types, through the
        same claim statement: `free` slots ask for `free` jobs of the other types, or `batch_size` times
        the free slots of a batch type. The groups take turns at being claimed first. A type with a batch
        still taking jobs is left to that batch, which claims for itself."""
        groups: dict[str | None, list[tuple[str, str]]] = {}
        gathering = self.gathering
        for pair in pairs:
            if pair[1] not in gathering:
                groups.setdefault(pair[1] if pair[1] in self._batch_sizes else None, []).append(pair)
        order = list(groups)
        if len(order) > 1:
            self._group_rotation = (self._group_rotation + 1) % len(order)
            order = order[self._group_rotation :] + order[: self._group_rotation]
        jobs: list[ClaimedJob] = []
        left = free
        self.expired_ahead = False
        self.limited_short = False
        for group in order:
            if left <= 0 or (jobs_left is not None and jobs_left - len(jobs) <= 0):
                break
            size = 1 if group is None else self._batch_sizes[group]
            limit = left * size
            if jobs_left is not None:
                limit = min(limit, jobs_left - len(jobs))
            group_pairs = groups[group]
            limited = sorted(self._limited.intersection(queue for queue, _ in group_pairs))
            claim = await self._claim_in_parts(limit, size, group_pairs, limited)
            jobs.extend(claim.jobs)
            left -= -(-len(claim.jobs) // size)  # the slots taken: one per job, or per batch begun
            self.expired_ahead = self.expired_ahead or claim.expired_ahead
            self.limited_short = self.limited_short or (len(claim.jobs) < limit and bool(limited))
        self._last_claim = time.monotonic()
        self.backlog = left <= 0
        return jobs

    async def _claim_in_parts(self, limit: int, size: int, pairs: list[tuple[str, str]], limited: list[str]) -> Claim:
        """Lease up to `limit` jobs of `pairs`; for a batch type, in `CLAIM_PARTS` statements at once when
        the claim is large. The parts skip one another's rows as they skip other workers'. A part that
        fails leaves the others' jobs to run; its error is raised only when no part leased anything (a
        claim retried after an error takes what is still available, so nothing is lost either way)."""
        parts = CLAIM_PARTS if size > 1 and limit >= 2 * CLAIM_PART_JOBS else 1
        if parts == 1:
            result: Claim = await self._run(self._claim_statement(limit, pairs, limited))
            return result
        per_part = math.ceil(math.ceil(limit / size) / parts) * size  # whole batches, spread over the parts
        limits = [min(per_part, limit - start) for start in range(0, limit, per_part)]
        done = await asyncio.gather(
            *(self._run(self._claim_statement(part, pairs, limited)) for part in limits), return_exceptions=True
        )
        claims = [claim for claim in done if isinstance(claim, Claim)]
        failures = [failure for failure in done if isinstance(failure, BaseException)]
        if failures and not any(claim.jobs for claim in claims):
            raise failures[0]
        for failure in failures:
            logger.warning(
                "worker %s: one part of a claim failed (%s); the other parts' jobs run", self.worker_id, failure
            )
        return Claim([job for claim in claims for job in claim.jobs], any(claim.expired_ahead for claim in claims))

    def _claim_statement(self, limit: int, pairs: list[tuple[str, str]], limited: list[str]) -> Statement[Claim]:
        return self.store.claim_jobs(
            worker_id=self.worker_id,
            limit=limit,
            pairs=pairs,
            lease_seconds=self.settings.lease_seconds,
            max_payload_bytes=self.settings.max_payload_bytes,
            limited_queues=limited,
        )

    async def claim_batch(
        self, job_type: str, limit: int, paused_queues: frozenset[str]
    ) -> tuple[list[ClaimedJob], float]:
        """For a batch short of its size: lease up to `limit` more jobs of its type, through the claim
        statement every job goes through (limits, leases and expiry as for any claim)."""
        if time.monotonic() - self._pairs_read >= self.poll_interval:
            await self._read_pairs()
        pairs = [pair for pair in self._pairs if pair[1] == job_type and pair[0] not in paused_queues]
        sent = time.monotonic()
        if not pairs:
            return [], sent
        claim: Claim = await self._run(
            self.store.claim_jobs(
                worker_id=self.worker_id,
                limit=limit,
                pairs=pairs,
                lease_seconds=self.settings.lease_seconds,
                max_payload_bytes=self.settings.max_payload_bytes,
                limited_queues=sorted(self._limited.intersection(queue for queue, _ in pairs)),
            )
        )
        return claim.jobs, sent

    async def wait_for_limits(self, longest: float) -> float:
        """After a claim that limits cut short: how long until a rate window frees room (at most
        `longest`, at least a few milliseconds); concurrency limits free slots when jobs end."""
        if not self.limited_short:
            return longest
        queues = sorted({queue for queue, _ in self._pairs if queue in self._limited})
        seconds: float | None = await self._run(self.queue_settings.seconds_until_rate_capacity(queues))
        if seconds is None:
            return min(longest, max(LIMITED_POLL_SECONDS, longest / 5))
        return min(longest, max(LIMITED_POLL_SECONDS, seconds))

    def _serving_order(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Pairs grouped by queue, the queues rotated one step per claim: each queue is first in turn."""
        queues = sorted({queue for queue, _ in pairs})
        if len(queues) > 1:
            self._rotation = (self._rotation + 1) % len(queues)
            queues = queues[self._rotation :] + queues[: self._rotation]
        order = {queue: n for n, queue in enumerate(queues)}
        return sorted(pairs, key=lambda pair: (order[pair[0]], pair[1]))
