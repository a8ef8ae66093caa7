"""Leadership: the election of at most one live worker of a schema to run the maintenance services.

The lease is a row in `<schema>.leader` (no session advisory lock, so it works behind PgBouncer in
transaction mode), taken when free or expired and renewed every heartbeat for
`worker_dead_after_seconds`. A leader that stops hands it back at once; one that dies loses it when it
expires, and another worker takes over at its next heartbeat. A leader that could not renew for two
thirds of the lease stops its services before anyone else can be elected: two leaders never run at
once as far as each can tell, and every service is safe even if they did (their statements skip
locked rows and the periodic enqueuer's unit of exactly-once is the database). While it leads, the
maintainer (`services/maintainer.py`) runs the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from jobbus.resilience import Backoff, Outage, first_line, is_transient
from jobbus.settings import Settings
from jobbus.store import MaintenanceStore, Statement
from jobbus.worker.service import Service
from jobbus.worker.services.maintainer import Maintainer

logger = logging.getLogger("jobbus.worker")


class Leadership(Service):
    def __init__(
        self,
        *,
        settings: Settings,
        store: MaintenanceStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        worker_id: str,
        instance_id: uuid.UUID,
        maintainer: Maintainer,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self._run = run
        self.worker_id = worker_id
        self.instance_id = instance_id
        self.maintainer = maintainer
        self._on_change = on_change
        self.is_leader = False
        self._held_since: float | None = None  # monotonic send time of the last successful renewal

    @property
    def ttl_seconds(self) -> float:
        return self.settings.worker_dead_after_seconds

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"leadership": self._loop()}

    async def close(self, timeout: float) -> None:
        """Stop taking part in the election and stop the services (no database call); `resign` then
        hands the lease back."""
        await super().close(timeout)
        await self.maintainer.close(timeout)

    async def resign(self, timeout: float) -> None:
        """Hand the lease back, if held, waiting at most `timeout` seconds for the database."""
        if self.is_leader:
            self.is_leader = False
            if self._on_change is not None:
                self._on_change(False)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._run(self.store.resign_leadership(self.instance_id)), timeout)
                logger.info("worker %s handed leadership back", self.worker_id, extra={"worker_id": self.worker_id})

    async def _loop(self) -> None:
        outage = Outage("leadership")
        backoff = Backoff(first=0.2, cap=self.settings.heartbeat_seconds)
        while True:
            delay = self.settings.heartbeat_seconds
            sent = time.monotonic()
            try:
                elected = await self._run(
                    self.store.hold_leadership(self.worker_id, self.instance_id, self.ttl_seconds)
                )
            except Exception as exc:
                if not is_transient(exc):
                    logger.error(
                        "worker %s cannot take part in the leader election (%s: %s): it stays a follower",
                        self.worker_id,
                        type(exc).__name__,
                        first_line(exc),
                    )
                    await self._step_down()
                    return
                outage.failed(exc)
                delay = backoff.next_delay()
                if self._held_since is not None and time.monotonic() - self._held_since > self.ttl_seconds * 2 / 3:
                    await self._step_down()  # another worker may be elected soon: stop acting now
            else:
                outage.recovered()
                backoff.reset()
                if elected is not None:
                    self._held_since = sent
                    if not self.is_leader:
                        self._become_leader()
                elif self.is_leader:
                    await self._step_down()
            await asyncio.sleep(delay)

    def _become_leader(self) -> None:
        self.is_leader = True
        if self._on_change is not None:
            self._on_change(True)
        logger.info(
            "worker %s is the leader: it runs %s",
            self.worker_id,
            ", ".join(s.name for s in self.maintainer.services) or "no service",
            extra={"worker_id": self.worker_id},
        )
        self.maintainer.start()

    async def _step_down(self) -> None:
        if self.is_leader:
            logger.warning("worker %s is no longer the leader", self.worker_id, extra={"worker_id": self.worker_id})
            if self._on_change is not None:
                self._on_change(False)
        self.is_leader = False
        self._held_since = None
        await self.maintainer.close()
