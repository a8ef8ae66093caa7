"""The leader's maintenance services: one concern per module, all on the same small interface."""

from __future__ import annotations

from typing import Protocol


class MaintenanceService(Protocol):
    """A maintenance task the leader runs every `interval` seconds (and only the leader)."""

    name: str

    @property
    def interval(self) -> float: ...

    async def run_once(self) -> None:
        """One round. Transient database errors are retried with backoff by the caller."""
