"""Live updates: one LISTEN and one pulse per dashboard process, shared by every open browser tab.

The process LISTENs on the App's job and control channels (new jobs, retries, control commands) and
reads one small pulse statement per `interval` (the newest finish, the newest queue sample, the latest
command, the running jobs, the workers' states). When either says something changed, every connected
tab gets one Server-Sent Event and fetches its own page again. Ten open tabs cost the database what one
does: a LISTEN and a pulse, never a statistics query per tab per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from jobbus.worker.listener import Listener

logger = logging.getLogger("jobbus.dashboard")

#: Seconds between pulses; changes are pushed at most this often.
PULSE_SECONDS = 1.0
#: A comment line this often keeps proxies from closing an idle event stream.
KEEPALIVE_SECONDS = 15.0
#: What a stream's queue receives when the server stops.
END = -1


class LiveUpdates:
    def __init__(
        self,
        *,
        pulse: Callable[[], Awaitable[Any]],
        listen_dsn: str | None,
        job_channel: str,
        control_channel: str,
        interval: float = PULSE_SECONDS,
    ) -> None:
        self._pulse = pulse
        self._interval = interval
        self._subscribers: set[asyncio.Queue[int]] = set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._ending = False
        self._version = 0
        self._listener = (
            Listener(
                listen_dsn,
                job_channel,
                control_channel,
                on_jobs=lambda _queue, _type: self._changed.set(),
                on_control=self._changed.set,
            )
            if listen_dsn
            else None
        )

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def end_streams(self) -> None:
        """End every open event stream (the server is stopping); callable from a signal handler."""
        self._ending = True
        if self._event_loop is not None and not self._event_loop.is_closed():
            self._event_loop.call_soon_threadsafe(self._wake_streams)

    def _wake_streams(self) -> None:
        for queue in list(self._subscribers):
            if queue.empty():
                queue.put_nowait(END)

    def _start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="jobbus-dashboard-live")
            if self._listener is not None:
                self._listener.start()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._listener is not None:
            await self._listener.close(5.0)

    async def _loop(self) -> None:
        last: Any = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._interval)
            notified = self._changed.is_set()
            self._changed.clear()
            if not self._subscribers:
                continue
            try:
                current = await self._pulse()
            except Exception as exc:  # the database is away: tabs keep what they show
                logger.debug("dashboard pulse failed: %s", exc)
                continue
            if notified or current != last:
                last = current
                self._version += 1
                for queue in list(self._subscribers):
                    if queue.empty():
                        queue.put_nowait(self._version)
            await asyncio.sleep(self._interval / 2)  # at most two pushes per interval, however busy

    def events(self, disconnected: Callable[[], Awaitable[bool]]) -> AsyncGenerator[str, None]:
        """The event stream of one tab: `data: <version>` on each change, comments to keep it open."""
        return merged_events([self], disconnected)


async def merged_events(
    sources: Sequence[LiveUpdates], disconnected: Callable[[], Awaitable[bool]]
) -> AsyncGenerator[str, None]:
    """The event stream of one tab over `sources` (one per cell of a page over every cell): `data:
    <version>` on a change in any of them, comments to keep it open; each source listens once however
    many tabs subscribe."""
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
    for source in sources:
        source._start()
        source._subscribers.add(queue)
    version = 0
    try:
        yield "retry: 2000\n\n"
        while not any(source._ending for source in sources):
            try:
                got = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                if await disconnected():
                    return
                yield ": keepalive\n\n"
                continue
            if got == END:
                return
            version = got if len(sources) == 1 else version + 1
            yield f"event: change\ndata: {version}\n\n"
    finally:
        for source in sources:
            source._subscribers.discard(queue)
