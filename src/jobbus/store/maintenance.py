"""Statements of the leader and its maintenance services (`sql/queries/maintenance.sql`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from jobbus.store.statements import Row, Statement, queries


@dataclass(frozen=True, slots=True)
class QueueSample:
    """One queue at one sampling instant: gauges, and the finished jobs no sample counted before."""

    queue: str
    available: int
    scheduled: int
    running: int
    completed: int
    failed: int
    cancelled: int
    oldest_available_seconds: float | None


class MaintenanceStore:
    """Builds the leadership and maintenance statements of one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._q = queries(schema)

    def hold_leadership(self, worker_id: str, instance_id: uuid.UUID, ttl_seconds: float) -> Statement[datetime | None]:
        """Take or renew the leadership lease: when this instance was elected, or None (another leads)."""
        params = {"worker_id": worker_id, "instance_id": instance_id, "ttl_seconds": ttl_seconds}
        return Statement(self._q["hold_leadership"], params, lambda rows, _: rows[0][0] if rows else None)

    def resign_leadership(self, instance_id: uuid.UUID) -> Statement[None]:
        return Statement(self._q["resign_leadership"], {"instance_id": instance_id}, lambda rows, _: None)

    def delete_finished_jobs(self, status: str, older_than_seconds: float, limit: int) -> Statement[int]:
        params = {"status": status, "older_than_seconds": older_than_seconds, "limit": limit}
        return Statement(self._q["delete_finished_jobs"], params, lambda rows, _: int(rows[0][0]))

    def delete_old_events(self, older_than_seconds: float, limit: int) -> Statement[int]:
        """Delete up to `limit` events emitted more than `older_than_seconds` ago; returns how many."""
        params = {"older_than_seconds": older_than_seconds, "limit": limit}
        return Statement(self._q["delete_old_events"], params, lambda rows, _: int(rows[0][0]))

    def delete_finished_groups(self, older_than_seconds: float, limit: int) -> Statement[int]:
        """Delete up to `limit` groups whose callback was scheduled more than `older_than_seconds` ago."""
        params = {"older_than_seconds": older_than_seconds, "limit": limit}
        return Statement(self._q["delete_finished_groups"], params, lambda rows, _: int(rows[0][0]))

    def delete_old_audit(self, older_than_seconds: float, limit: int) -> Statement[int]:
        """Delete up to `limit` audit entries older than `older_than_seconds` (at least a day: the function
        refuses less); returns how many."""
        params = {"older_than_seconds": older_than_seconds, "limit": limit}
        return Statement(self._q["delete_old_audit"], params, lambda rows, _: int(rows[0][0]))

    def queued_pairs(self) -> Statement[list[tuple[str, str]]]:
        """Every (queue, type) that has queued jobs: one index probe per pair."""
        return Statement(self._q["queued_pairs"], {}, lambda rows, _: [(r[0], r[1]) for r in rows])

    def sample_queues(
        self, interval_seconds: float, *, late_seconds: float, keep_seconds: float
    ) -> Statement[list[QueueSample]]:
        """Write one sample of every queue for the whole fleet, each finished job counted once: jobs
        committed up to `late_seconds` after a sample they predate are counted by the next, tallies of what
        was counted are kept `keep_seconds` (a clock set back by less loses nothing); returns the rows
        written."""

        def decode(rows: list[Row], _: int) -> list[QueueSample]:
            return [
                QueueSample(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), r[7]) for r in rows
            ]

        params = {"interval_seconds": interval_seconds, "late_seconds": late_seconds, "keep_seconds": keep_seconds}
        return Statement(self._q["sample_queues"], params, decode)

    def compact_queue_stats(self, *, raw_seconds: int, step_seconds: int) -> Statement[int]:
        """Merge the samples older than `raw_seconds` into one row per queue and step; returns the rows
        written."""
        params = {"raw_seconds": raw_seconds, "step_seconds": step_seconds}
        return Statement(self._q["compact_queue_stats"], params, lambda _, rowcount: rowcount)

    def prune_queue_stats(self, keep_seconds: float) -> Statement[int]:
        return Statement(self._q["prune_queue_stats"], {"keep_seconds": keep_seconds}, lambda _, rowcount: rowcount)
