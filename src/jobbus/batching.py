"""Concurrent `schedule` calls of one App share statements.

Every enqueue is a commit, and a commit that notifies holds PostgreSQL's notification lock until its
WAL is flushed: notifying transactions commit one at a time, across the whole server. Fifty coroutines
each scheduling one job therefore pay fifty serial flushes. Here, callers that arrive while statements
are in flight wait for the next one and go in it together: one commit, one notification per (queue,
type), each caller still answered only once its jobs are committed. A lone caller is sent at once,
so nothing waits that did not have to.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from jobbus.errors import DatabaseUnavailableError
from jobbus.models import JobSpec

Found = dict[tuple[str, str], uuid.UUID]
Insert = Callable[[Sequence[JobSpec]], Awaitable[Found]]


@dataclass(slots=True)
class _Caller:
    specs: Sequence[JobSpec]
    answer: asyncio.Future[Found] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class InsertBatcher:
    """Sends up to `in_flight` insert statements at a time; callers arriving meanwhile share the next.

    A shared statement that fails for a reason other than the database being unreachable is sent again
    per caller, so one caller's bad row (a trigger's refusal, say) fails that caller alone.
    """

    def __init__(self, insert: Insert, *, in_flight: int, max_jobs: int) -> None:
        self._insert = insert
        self._in_flight = in_flight
        self._max_jobs = max_jobs
        self._waiting: list[_Caller] = []
        self._sending = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def insert(self, specs: Sequence[JobSpec]) -> Found:
        if not self._waiting and self._sending < self._in_flight:
            # Nobody to share with: sent from the caller's own task, without a task and a future of its own.
            self._sending += 1
            try:
                return await self._insert(specs)
            finally:
                self._sending -= 1
                self._send_more()
        caller = _Caller(specs)
        self._waiting.append(caller)
        self._send_more()
        return await caller.answer

    def _send_more(self) -> None:
        while self._waiting and self._sending < self._in_flight:
            batch = self._take()
            if not batch:
                return
            self._sending += 1
            task = asyncio.get_running_loop().create_task(self._send(batch), name="jobbus-insert-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Caller]:
        """Callers still waiting (a cancelled one is dropped), up to `max_jobs` jobs (one caller always)."""
        batch: list[_Caller] = []
        jobs = 0
        while self._waiting:
            caller = self._waiting[0]
            if caller.answer.done():
                self._waiting.pop(0)
                continue
            if batch and jobs + len(caller.specs) > self._max_jobs:
                break
            batch.append(self._waiting.pop(0))
            jobs += len(caller.specs)
        return batch

    async def _send(self, batch: list[_Caller]) -> None:
        try:
            if len(batch) == 1:
                await _answer(batch[0], self._insert(batch[0].specs))
                return
            try:
                found = await self._insert(_combined(batch))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, DatabaseUnavailableError):  # no statement would get through either
                    for caller in batch:
                        _fail(caller, exc)
                    return
                for caller in batch:
                    await _answer(caller, self._insert(caller.specs))
                return
            for caller in batch:
                if not caller.answer.done():
                    caller.answer.set_result(found)
        except BaseException:  # cancelled with the loop: no caller is left waiting
            for caller in batch:
                caller.answer.cancel()
            raise
        finally:
            self._sending -= 1
            self._send_more()


def _combined(batch: Sequence[_Caller]) -> list[JobSpec]:
    """Every caller's specs, a (type, unique_key) repeated across callers kept once: they share its job."""
    specs: list[JobSpec] = []
    keys: set[tuple[str, str]] = set()
    for caller in batch:
        for spec in caller.specs:
            if spec.unique_key is not None:
                key = (spec.type, spec.unique_key)
                if key in keys:
                    continue
                keys.add(key)
            specs.append(spec)
    return specs


async def _answer(caller: _Caller, insert: Awaitable[Found]) -> None:
    try:
        found = await insert
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _fail(caller, exc)
        return
    if not caller.answer.done():
        caller.answer.set_result(found)


def _fail(caller: _Caller, exc: BaseException) -> None:
    if not caller.answer.done():
        caller.answer.set_exception(exc)
