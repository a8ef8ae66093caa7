"""Waiting for jobs to finish (`App.wait`): one LISTEN connection per App, however many waiters.

Every statement that makes jobs terminal notifies their ids on the schema's `_done` channel (the
trigger job_finished of sql/current.sql, in the same transaction, so a notification means the job is
terminal and committed). A waiter registers its job id here *before* it reads the job, so a job that finishes
between the read and the wait is not missed; when the listening connection is lost, every waiter is
woken to read its job again once it is back. Without a direct connection for LISTEN (transaction
pooling without `listen_dsn`), waiters read their job every poll interval instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from typing import Any

import psycopg

from jobbus.errors import DatabaseUnavailableError
from jobbus.resilience import Backoff, first_line

logger = logging.getLogger("jobbus")


def vanished_message(job_id: uuid.UUID, *, seen: bool, woken: bool) -> str:
    """What `App.wait` says when its job is not found: `seen` (read before, not terminal), `woken` (a
    notification named it since, or the listening connection was lost)."""
    if seen and woken:
        return f"job {job_id} finished and was deleted (by retention or prune) before wait() could read it"
    if seen:
        return f"job {job_id} was deleted while wait() waited for it (it finished and was pruned, or was deleted)"
    return (
        f"job {job_id} does not exist: it was never scheduled, or it finished and was deleted (by retention or "
        "prune) before wait() could read it"
    )


class FinishedJobs:
    """The async listener: futures per job id, resolved when a notification names the job."""

    def __init__(self, dsn: str | None, channel: str, connection_kwargs: dict[str, Any]) -> None:
        self._dsn = dsn
        self._channel = channel
        self._kwargs = connection_kwargs
        self._waiters: dict[uuid.UUID, set[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    @property
    def polling(self) -> bool:
        """No connection can LISTEN: waiters read their job every poll interval."""
        return self._dsn is None

    async def started(self, timeout: float) -> None:
        """Start the listener if it is not running and wait (at most `timeout`) until it listens."""
        if self._dsn is None:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(self._dsn), name="jobbus-wait-listener")
        try:
            await asyncio.wait_for(self._listening.wait(), timeout)
        except TimeoutError:
            raise DatabaseUnavailableError(
                f"could not LISTEN for finished jobs within {timeout:g} s (is the database reachable?)", written=False
            ) from None

    def register(self, job_id: uuid.UUID) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, set()).add(future)
        return future

    async def wait(self, woken: asyncio.Future[None], timeout: float | None) -> bool:
        """Whether `woken` (from `register`) resolved within `timeout` seconds (None: no limit)."""
        try:
            await asyncio.wait_for(woken, timeout)
        except TimeoutError:
            return False
        return True

    def is_woken(self, woken: asyncio.Future[None]) -> bool:
        return woken.done()

    def unregister(self, job_id: uuid.UUID, future: asyncio.Future[None]) -> None:
        waiting = self._waiters.get(job_id)
        if waiting is not None:
            waiting.discard(future)
            if not waiting:
                del self._waiters[job_id]

    def _wake(self, job_ids: list[uuid.UUID] | None) -> None:
        """Resolve the futures of these jobs (None: of every job)."""
        for job_id in list(self._waiters) if job_ids is None else job_ids:
            for future in self._waiters.pop(job_id, ()):
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._listening.clear()
        self._wake(None)

    async def _listen(self, dsn: str) -> None:
        backoff = Backoff(first=0.1, cap=5.0)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(dsn, **{**self._kwargs, "autocommit": True}) as conn:
                    await conn.execute(f'LISTEN "{self._channel}"'.encode())
                    self._listening.set()
                    backoff.reset()
                    self._wake(None)  # anything may have finished while nobody listened: read again
                    async for notification in conn.notifies():
                        self._wake(parse_ids(notification.payload))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._listening.clear()
                self._wake(None)
                logger.warning("the wait listener lost its connection (%s); reconnecting", first_line(exc))
                await asyncio.sleep(backoff.next_delay())


class SyncFinishedJobs:
    """The blocking twin for `app.sync.wait`: one listening connection read by one daemon thread."""

    def __init__(self, dsn: str | None, channel: str, connection_kwargs: dict[str, Any]) -> None:
        self._dsn = dsn
        self._channel = channel
        self._kwargs = connection_kwargs
        self._lock = threading.Lock()
        self._waiters: dict[uuid.UUID, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._stop = threading.Event()

    @property
    def polling(self) -> bool:
        return self._dsn is None

    def started(self, timeout: float) -> None:
        if self._dsn is None:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._listen, args=(self._dsn,), daemon=True)
                self._thread.start()
        if not self._listening.wait(timeout):
            raise DatabaseUnavailableError(
                f"could not LISTEN for finished jobs within {timeout:g} s (is the database reachable?)", written=False
            )

    def register(self, job_id: uuid.UUID) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(event)
        return event

    def wait(self, woken: threading.Event, timeout: float | None) -> bool:
        return woken.wait(timeout)

    def is_woken(self, woken: threading.Event) -> bool:
        return woken.is_set()

    def unregister(self, job_id: uuid.UUID, event: threading.Event) -> None:
        with self._lock:
            waiting = self._waiters.get(job_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[job_id]

    def _wake(self, job_ids: list[uuid.UUID] | None) -> None:
        with self._lock:
            woken = [self._waiters.pop(i, set()) for i in (list(self._waiters) if job_ids is None else job_ids)]
        for events in woken:
            for event in events:
                event.set()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        self._listening.clear()
        self._wake(None)

    def _listen(self, dsn: str) -> None:
        backoff = Backoff(first=0.1, cap=5.0)
        while not self._stop.is_set():
            try:
                with psycopg.Connection.connect(dsn, **{**self._kwargs, "autocommit": True}) as conn:
                    conn.execute(f'LISTEN "{self._channel}"'.encode())
                    self._listening.set()
                    backoff.reset()
                    self._wake(None)
                    while not self._stop.is_set():
                        for notification in conn.notifies(timeout=0.5):
                            self._wake(parse_ids(notification.payload))
            except Exception as exc:
                self._listening.clear()
                self._wake(None)
                logger.warning("the wait listener lost its connection (%s); reconnecting", first_line(exc))
                self._stop.wait(backoff.next_delay())


def parse_ids(payload: str) -> list[uuid.UUID]:
    """The ids of a `_done` notification (comma-separated); a malformed entry is skipped."""
    ids = []
    for text in payload.split(","):
        try:
            ids.append(uuid.UUID(text))
        except ValueError:
            continue
    return ids


def timeout_message(job_id: uuid.UUID, status: str, timeout: float) -> str:
    return f"job {job_id} is still {status} after {timeout:g} s"
