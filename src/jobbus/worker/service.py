"""`Service`: the start()/close(timeout) base of the worker's long-lived parts, whose loops run as tasks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any

logger = logging.getLogger("jobbus.worker")


class Service:
    """A long-lived part of the worker: `start()` runs its `loops()` as tasks of the current event loop,
    `close(timeout)` stops them within `timeout` seconds, so a stopping worker never hangs on one."""

    _tasks: Sequence[asyncio.Task[None]] = ()

    def loops(self) -> Mapping[str, Coroutine[Any, Any, None]]:
        """The loops to run, by task name (`jobbus-<name>`)."""
        raise NotImplementedError

    def start(self) -> None:
        self._tasks = [asyncio.create_task(loop, name=f"jobbus-{name}") for name, loop in self.loops().items()]

    async def close(self, timeout: float) -> None:
        tasks, self._tasks = self._tasks, ()
        await stop_tasks(tasks, timeout)


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], timeout: float) -> None:
    """Cancel `tasks` and wait for them to end, at most `timeout` seconds.

    The cancellation is repeated while waiting: on Python 3.11 one that lands while the connection
    pool is inside `asyncio.wait_for` can be lost, and the task would run on. A task still running at
    the deadline is left behind, logged, so a stopping worker never hangs on it.
    """
    pending = {task for task in tasks if not task.done()}
    deadline = time.monotonic() + timeout
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            logger.warning("%d background task(s) did not stop: %s", len(pending), [t.get_name() for t in pending])
            return
        _, pending = await asyncio.wait(pending, timeout=min(0.2, remaining))
