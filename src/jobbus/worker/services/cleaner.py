"""The cleaner: deletes finished jobs once their retention has passed, and emitted events and finished
groups' rows once `retention_event_seconds` has, and audit entries once `retention_audit_seconds` has.

`retention_completed_seconds` (1 day), `retention_cancelled_seconds` (1 day) and
`retention_failed_seconds` (7 days); None keeps those jobs. `retention_event_seconds` (7 days) for the
`event` rows and the `job_group` rows whose callback is scheduled; None keeps them.
`retention_audit_seconds` (90 days, at least one) for `audit_log`. Deletes go in batches of `BATCH`
rows, each its own short transaction through `delete_finished_jobs`, `delete_old_events`,
`delete_finished_groups` and `delete_old_audit` (SECURITY DEFINER: the worker role needs no DELETE
right, and has none on the audit trail), oldest first, skipping rows someone holds. Claims never wait
for them: they touch only queued rows. Each round stops after `ROUND_SECONDS` of work, so a backlog of expired rows is
worked off over several rounds instead of in one long burst.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jobbus.settings import Settings
from jobbus.store import MaintenanceStore, Statement

BATCH = 1000
ROUND_SECONDS = 2.0


class Cleaner:
    name = "cleaner"

    def __init__(
        self,
        *,
        settings: Settings,
        maintenance: MaintenanceStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        interval: float = 10.0,
    ) -> None:
        self.settings = settings
        self.maintenance = maintenance
        self._run = run
        self.interval = interval
        self.deleted = 0

    def retentions(self) -> dict[str, float]:
        """Seconds each finished status is kept; statuses kept forever are left out."""
        kept = {
            "completed": self.settings.retention_completed_seconds,
            "cancelled": self.settings.retention_cancelled_seconds,
            "failed": self.settings.retention_failed_seconds,
        }
        return {status: seconds for status, seconds in kept.items() if seconds is not None}

    def batches(self) -> list[Callable[[], Statement[int]]]:
        """One batch of each kind of row past its retention, in the order a round deletes them."""
        maintenance = self.maintenance
        kinds: list[Callable[[], Statement[int]]] = [
            functools.partial(maintenance.delete_finished_jobs, status, seconds, BATCH)
            for status, seconds in self.retentions().items()
        ]
        events = self.settings.retention_event_seconds
        if events is not None:
            kinds.append(functools.partial(maintenance.delete_old_events, events, BATCH))
            kinds.append(functools.partial(maintenance.delete_finished_groups, events, BATCH))
        audit = self.settings.retention_audit_seconds
        if audit is not None:
            kinds.append(functools.partial(maintenance.delete_old_audit, audit, BATCH))
        return kinds

    async def run_once(self) -> None:
        deadline = time.monotonic() + ROUND_SECONDS
        for batch in self.batches():
            while time.monotonic() < deadline:
                deleted: int = await self._run(batch())
                self.deleted += deleted
                if deleted < BATCH:
                    break
