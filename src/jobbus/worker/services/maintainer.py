"""The maintainer: runs every maintenance service, each in its own loop, while this worker leads.

Started when the worker is elected and closed when it steps down (`worker/leader.py`). A service runs
every `service.interval` seconds; a transient database error is retried with backoff, any other is
logged and tried again `SERVICE_RETRY_SECONDS` later: one failing service never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from jobbus.resilience import Backoff, Outage, first_line, is_transient
from jobbus.worker.service import Service
from jobbus.worker.services import MaintenanceService

logger = logging.getLogger("jobbus.worker")

#: After a service fails with a non-transient error, it is tried again this much later.
SERVICE_RETRY_SECONDS = 60.0
#: A service still running this long after it was asked to stop is left behind.
SERVICE_STOP_SECONDS = 5.0


class Maintainer(Service):
    def __init__(self, services: Sequence[MaintenanceService]) -> None:
        self.services = list(services)

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {service.name: self._run_service(service) for service in self.services}

    async def close(self, timeout: float = SERVICE_STOP_SECONDS) -> None:
        await super().close(min(timeout, SERVICE_STOP_SECONDS))

    async def _run_service(self, service: MaintenanceService) -> None:
        """One service, every `service.interval` seconds, until the maintainer is closed."""
        outage = Outage(service.name)
        backoff = Backoff()
        while True:
            try:
                await service.run_once()
            except Exception as exc:
                if is_transient(exc):
                    outage.failed(exc)
                    await asyncio.sleep(backoff.next_delay())
                    continue
                logger.error(
                    "%s failed (%s: %s); trying again in %.0f s",
                    service.name,
                    type(exc).__name__,
                    first_line(exc),
                    SERVICE_RETRY_SECONDS,
                    exc_info=exc,
                )
                await asyncio.sleep(SERVICE_RETRY_SECONDS)
                continue
            outage.recovered()
            backoff.reset()
            await asyncio.sleep(service.interval)
