"""The periodic jobs a worker's code declares, stored at its start (every worker, leader or not)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from jobbus.store import Statement
from jobbus.worker.app_view import AppView

logger = logging.getLogger("jobbus.worker")


async def sync_periodics(
    app: AppView, run: Callable[[Statement[Any]], Awaitable[Any]], *, types: Sequence[str], worker_id: str
) -> None:
    """Store the periodic jobs this code declares; delete the ones it no longer declares among the
    job types this worker handles (other workers' types are theirs to keep)."""
    store = app.periodic_store
    now = await run(store.database_now())
    declared = app.registry.periodics_here()
    for spec in declared.values():
        next_run_at = spec.schedule.next_after(now)
        if not await run(store.upsert(spec, source="code", next_run_at=next_run_at)):
            logger.warning(
                "periodic job %s is declared in code, but a periodic job of that name was added at run time: "
                "the one in the database stays; remove it (jobbus periodic remove %s) to use the code's",
                spec.name,
                spec.name,
            )
    retired = await run(store.retire_code_periodics(types, list(declared)))
    for name in retired:
        logger.info("periodic job %s is no longer declared in code: removed", name)
    for periodic in await run(store.list_periodic()):
        if periodic.type not in types:  # the types it claims: --type narrows them
            logger.warning(
                "periodic job %s enqueues jobs of type %s, which no handler of this worker serves: unless "
                "another worker handles it, its jobs wait in queue %s forever (a typo, or a module not imported?)",
                periodic.name,
                periodic.type,
                periodic.queue,
                extra={"worker_id": worker_id, "periodic": periodic.name, "job_type": periodic.type},
            )
