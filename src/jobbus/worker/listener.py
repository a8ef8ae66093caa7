"""LISTEN on one dedicated connection per worker: wake-ups for new jobs and control commands.

A job notification carries its queue and type (a JSON array): only a worker that can take such a job
wakes up to claim.
Notifications only shorten waits; the worker also polls, so a lost notification (or a listener that
is reconnecting) delays work by at most one poll interval and never loses it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
from psycopg import sql

from jobbus.resilience import Backoff, Outage
from jobbus.worker.service import Service


class Listener(Service):
    def __init__(
        self,
        dsn: str,
        job_channel: str,
        control_channel: str,
        *,
        on_jobs: Callable[[str | None, str | None], None],
        on_control: Callable[[], None],
    ) -> None:
        self._dsn = dsn
        self._job_channel = job_channel
        self._control_channel = control_channel
        self._on_jobs = on_jobs
        self._on_control = on_control
        self._outage = Outage("listener")

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"listener": self._loop()}

    async def _loop(self) -> None:
        backoff = Backoff(cap=10.0)
        while True:
            try:
                conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
                async with conn:
                    for channel in (self._job_channel, self._control_channel):
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self._outage.recovered()
                    backoff.reset()
                    # Anything may have happened while we were not listening.
                    self._on_control()
                    self._on_jobs(None, None)
                    async for notify in conn.notifies():
                        if notify.channel == self._control_channel:
                            self._on_control()
                        else:
                            self._on_jobs(*job_notification(notify.payload))
            except Exception as exc:  # polling covers for the listener: it never stops the worker
                self._outage.failed(exc)
                await asyncio.sleep(backoff.next_delay())


def job_notification(payload: str) -> tuple[str | None, str | None]:
    """(queue, type) from a job notification; (None, None) when it says nothing we can use."""
    try:
        queue, job_type = json.loads(payload)
    except (ValueError, TypeError):
        return None, None
    return (queue, job_type) if isinstance(queue, str) and isinstance(job_type, str) else (None, None)
