"""`AppView`: what a worker reads of the `App` it runs for, so that the worker never imports the App."""

from __future__ import annotations

from typing import Protocol

from jobbus.registry import Registry
from jobbus.settings import Settings
from jobbus.store import JobStore
from jobbus.store.periodic import PeriodicStore
from jobbus.store.queues import QueueStore


class AppView(Protocol):
    """An App's settings, registry (handlers, periodic jobs, listeners, job scope) and stores, and its
    pool, which a worker opens for as long as it runs: its handlers schedule through the App."""

    settings: Settings
    registry: Registry
    store: JobStore
    periodic_store: PeriodicStore
    queue_store: QueueStore

    @property
    def dsn(self) -> str: ...

    async def open(self, *, timeout: float | None = None) -> None: ...

    async def close(self) -> None: ...

    async def check_schema(self) -> int: ...
