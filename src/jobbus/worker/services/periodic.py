"""The periodic enqueuer: one job per due tick of every periodic job, fleet-wide.

Each due periodic job is moved to its next tick by one statement that also inserts the tick's job
(`enqueue_tick`): the row must still be at the tick this leader read, so a second leader, or a
redefinition meanwhile, makes the statement a no-op; and the next tick it stores must be later than
the tick it enqueues (`Schedule.next_after` is strictly after), so a row never comes back to a tick
it has had. Ticks missed for less than the catch-up window (a leader failover: twice
`worker_dead_after_seconds`) each still get their job, so a failover leaves no gap; after a longer
downtime only the latest missed tick runs (its `available_at` is the tick), never a burst. With
`overlap=False` a tick is skipped while the previous job of the same periodic is queued or running.
Ticks come from the database's clock, never the worker's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from jobbus.periodic import Schedule
from jobbus.requests import new_job_id
from jobbus.store import Statement
from jobbus.store.periodic import DuePeriodic, PeriodicStore

logger = logging.getLogger("jobbus.worker")

#: The enqueuer looks at least this often, and sooner when a tick is due sooner.
LONGEST_SLEEP_SECONDS = 1.0
SHORTEST_SLEEP_SECONDS = 0.02
#: At most this many missed ticks of one periodic job are caught up in one round.
MAX_CATCH_UP = 100


class PeriodicEnqueuer:
    name = "periodic enqueuer"

    def __init__(
        self,
        *,
        store: PeriodicStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        max_attempts_of: Callable[[str], int],
        catch_up_seconds: float,
    ) -> None:
        self.store = store
        self._run = run
        self._max_attempts_of = max_attempts_of
        self.catch_up = timedelta(seconds=catch_up_seconds)
        self.interval = LONGEST_SLEEP_SECONDS

    async def run_once(self) -> None:
        for due in await self._run(self.store.due()):
            await self._catch_up(due)
        until_next: float | None = await self._run(self.store.seconds_to_next_run())
        if until_next is None:
            self.interval = LONGEST_SLEEP_SECONDS
        else:
            self.interval = min(LONGEST_SLEEP_SECONDS, max(SHORTEST_SLEEP_SECONDS, until_next))

    async def _catch_up(self, due: DuePeriodic) -> None:
        """Every missed tick within the catch-up window, in order; else only the latest."""
        schedule = Schedule(due.cron, due.every_seconds, due.timezone)
        if due.next_run_at < due.now - self.catch_up:
            ticks = [max(schedule.latest_until(due.now), due.next_run_at)]
        else:
            ticks = [due.next_run_at]
            while len(ticks) < MAX_CATCH_UP and (following := schedule.next_after(ticks[-1])) <= due.now:
                ticks.append(following)
        expected = due
        for n, tick in enumerate(ticks):
            last = n == len(ticks) - 1
            next_run_at = schedule.next_after(due.now) if last else ticks[n + 1]
            advanced, enqueued = await self._run(
                self.store.enqueue_tick(
                    expected,
                    tick=tick,
                    next_run_at=next_run_at,
                    job_id=new_job_id(),
                    max_attempts=self._max_attempts_of(due.type),
                )
            )
            if not advanced:
                return  # another leader, or a redefinition, moved it meanwhile
            if not enqueued:
                logger.info("periodic %s: tick %s skipped, its previous job is still queued or running", due.name, tick)
            expected = replace(due, next_run_at=next_run_at)
