"""The queue sampler: one row per queue every `stats_interval_seconds` in `<schema>.queue_stat`.

Gauges (available, scheduled, running, the age of the oldest available job) and the jobs that
finished since the previous sample, read once for the whole fleet by the leader. Metrics and the
dashboard read these rows: no request path and no scrape counts the job table. Samples older than
`KEEP_SECONDS` are deleted. The rows written are handed to the worker's observers (the leader's
Prometheus queue gauges), so a scrape never queries the database.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from jobbus.store import MaintenanceStore, QueueSample, Statement

KEEP_SECONDS = 2 * 86400.0


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

    async def run_once(self) -> None:
        samples = await self._run(self.maintenance.sample_queues(self.interval))
        if self._on_sample is not None:
            self._on_sample(samples)
        await self._run(self.maintenance.prune_queue_stats(KEEP_SECONDS))
