"""Statements of periodic jobs (`sql/queries/periodic.sql`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobbus.periodic import Periodic, PeriodicSpec
from jobbus.store.statements import Row, Statement, queries


@dataclass(frozen=True, slots=True)
class DuePeriodic:
    """A periodic job due now, as the database's clock sees it."""

    name: str
    type: str
    cron: str | None
    every_seconds: float | None
    timezone: str
    next_run_at: datetime
    now: datetime


class PeriodicStore:
    def __init__(self, schema: str, channel: str) -> None:
        self.channel = channel
        self._q = queries(schema)

    def upsert(self, spec: PeriodicSpec, *, source: str, next_run_at: datetime) -> Statement[bool]:
        """Add or redefine; False when the name is taken by a periodic job of the other source."""
        params = {
            "name": spec.name,
            "type": spec.type,
            "cron": spec.schedule.cron,
            "every_seconds": spec.schedule.every_seconds,
            "timezone": spec.schedule.timezone,
            "configuration": spec.configuration,
            "queue": spec.queue,
            "priority": spec.priority,
            "overlap": spec.overlap,
            "source": source,
            "next_run_at": next_run_at,
        }
        return Statement(self._q["upsert_periodic"], params, lambda rows, _: bool(rows))

    def retire_code_periodics(self, types: Sequence[str], declared: Sequence[str]) -> Statement[list[str]]:
        params = {"types": list(types), "declared": list(declared)}
        return Statement(self._q["retire_code_periodics"], params, lambda rows, _: [r[0] for r in rows])

    def remove(self, name: str) -> Statement[bool]:
        return Statement(self._q["remove_periodic"], {"name": name}, lambda rows, _: bool(rows))

    def set_enabled(self, name: str, enabled: bool) -> Statement[bool]:
        return Statement(self._q["enable_periodic"], {"name": name, "enabled": enabled}, lambda rows, _: bool(rows))

    def list_periodic(self, name: str | None = None) -> Statement[list[Periodic]]:
        def decode(rows: list[Row], _: int) -> list[Periodic]:
            return [
                Periodic(
                    name=r[0],
                    type=r[1],
                    cron=r[2],
                    every=None if r[3] is None else timedelta(seconds=float(r[3])),
                    timezone=r[4],
                    enabled=bool(r[5]),
                    next_run_at=r[6],
                    last_run_at=r[7],
                    last_job_id=r[8],
                    queue=r[9],
                    priority=int(r[10]),
                    overlap=bool(r[11]),
                    configuration=dict(r[12]),
                    source=r[13],
                )
                for r in rows
            ]

        return Statement(self._q["list_periodic"], {"name": name}, decode)

    def due(self) -> Statement[list[DuePeriodic]]:
        return Statement(self._q["due_periodics"], {}, lambda rows, _: [DuePeriodic(*r) for r in rows])

    def seconds_to_next_run(self) -> Statement[float | None]:
        return Statement(
            self._q["next_periodic_run"], {}, lambda rows, _: None if rows[0][0] is None else float(rows[0][0])
        )

    def enqueue_tick(
        self,
        due: DuePeriodic,
        *,
        tick: datetime,
        next_run_at: datetime,
        job_id: uuid.UUID,
        max_attempts: int,
    ) -> Statement[tuple[bool, bool]]:
        """Move `due` to `next_run_at` and enqueue the job of `tick`, exactly once: (advanced, enqueued)."""
        params = {
            "name": due.name,
            "expected": due.next_run_at,
            "next_run_at": next_run_at,
            "tick": tick,
            "job_id": job_id,
            "max_attempts": max_attempts,
            "channel": self.channel,
        }
        return Statement(self._q["enqueue_tick"], params, lambda rows, _: (rows[0][0] > 0, rows[0][1] > 0))

    def database_now(self) -> Statement[datetime]:
        return Statement(self._q["database_now"], {}, lambda rows, _: rows[0][0])

    def periodic_type(self, name: str) -> Statement[str | None]:
        return Statement(self._q["periodic_type"], {"name": name}, lambda rows, _: rows[0][0] if rows else None)

    def run_now(self, name: str, *, job_id: uuid.UUID, max_attempts: int) -> Statement[bool]:
        params = {"name": name, "job_id": job_id, "max_attempts": max_attempts, "channel": self.channel}
        return Statement(self._q["run_periodic_now"], params, lambda rows, _: bool(rows))
