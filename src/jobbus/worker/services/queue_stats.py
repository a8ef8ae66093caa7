"""The queue sampler: one row per queue every `stats_interval_seconds` in `<schema>.queue_stat`.

Gauges (available, scheduled, running, the age of the oldest available job) and the finished jobs no
sample counted before, read once for the whole fleet by the leader. Each finished job is counted once:
two leaders for a moment take turns, a job committed after a sample it predates (by up to `LATE_SECONDS`)
is counted by the next one, and a database clock set back (by up to `TALLY_SECONDS`) neither loses nor
repeats a count (`queue_tally`, sql/current.sql). Metrics and the dashboard read these rows: no request
path and no scrape counts the job table. Every sample of the last `RAW_SECONDS` is kept; older ones are
merged into one row per queue and `STEP_SECONDS` (the dashboard's 24 h and 7 d charts), and rows older
than `KEEP_SECONDS` are deleted: at most about 1,400 rows per queue whatever the interval. The rows
written are handed to the worker's observers (the leader's Prometheus queue gauges), so a scrape never
queries the database.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from jobbus.store import MaintenanceStore, QueueSample, Statement

KEEP_SECONDS = 7 * 86400.0 + 3600.0
RAW_SECONDS = 3600
STEP_SECONDS = 600
#: How long after its finished_at a job's transaction may commit and still be counted.
LATE_SECONDS = 10.0
#: How long the tallies of counted jobs are kept (per queue, one row per 10 seconds with finished jobs).
TALLY_SECONDS = 86400.0


class QueueSampler:
    name = "queue sampler"

    def __init__(
        self,
        *,
        maintenance: MaintenanceStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        interval: float,
        on_sample: Callable[[Sequence[QueueSample]], None] | None = None,
    ) -> None:
        self.maintenance = maintenance
        self._run = run
        self.interval = interval
        self._on_sample = on_sample
        self._compacted_at: float | None = None

    async def run_once(self) -> None:
        samples = await self._run(
            self.maintenance.sample_queues(self.interval, late_seconds=LATE_SECONDS, keep_seconds=TALLY_SECONDS)
        )
        if self._on_sample is not None:
            self._on_sample(samples)
        now = time.monotonic()
        if self._compacted_at is None or now - self._compacted_at >= STEP_SECONDS / 2:
            await self._run(self.maintenance.compact_queue_stats(raw_seconds=RAW_SECONDS, step_seconds=STEP_SECONDS))
            await self._run(self.maintenance.prune_queue_stats(KEEP_SECONDS))
            self._compacted_at = now
