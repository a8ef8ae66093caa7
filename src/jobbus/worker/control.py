"""The worker's side of the control plane: read the durable pause state and the commands for it.

Read every poll interval and at once when a control notification arrives. Commands are matched by
target when they are read (every worker, this worker's id, or a queue it serves), so a command issued
while the worker was cut off from the database reaches it when it is back. The worker acknowledges
the latest generation it has read through its (instance-fenced) registry refresh.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from jobbus.store import ControlState, Statement, WorkerStore

logger = logging.getLogger("jobbus.worker")


class ControlReader:
    def __init__(
        self,
        *,
        store: WorkerStore,
        run: Callable[[Statement[Any]], Awaitable[Any]],
        worker_id: str,
        queues: Sequence[str] | None,
        on_drain: Callable[[], None],
        on_stop: Callable[[int], None],
        on_acked: Callable[[], Awaitable[None]],
    ) -> None:
        self._store = store
        self._run = run
        self.worker_id = worker_id
        self.queues = queues
        self._on_drain = on_drain
        self._on_stop = on_stop
        self._on_acked = on_acked
        self.acked_generation = 0
        self.paused = False
        self.paused_queues: frozenset[str] = frozenset()

    async def read(self) -> None:
        state: ControlState = await self._run(
            self._store.read_control(self.worker_id, self.queues, self.acked_generation)
        )
        self.paused_queues = state.paused_queues
        was_paused = self.paused
        self.paused = (
            state.paused_all
            or state.paused_worker
            or (self.queues is not None and all(q in state.paused_queues for q in self.queues))
        )
        if self.paused != was_paused:
            logger.info("worker %s %s", self.worker_id, "paused" if self.paused else "resumed")
        for generation, action in state.commands:
            logger.info("worker %s: control command %s (generation %d)", self.worker_id, action, generation)
            if action == "drain":
                self._on_drain()
            elif action == "stop":
                self._on_stop(0)
            elif action == "restart":
                self._on_stop(75)
        if state.latest_generation > self.acked_generation:
            self.acked_generation = state.latest_generation
            await self._on_acked()
