"""The batched completer: outcomes of many jobs written in one fenced statement.

Job tasks hand in their outcome and wait for it to be durable. While one write is in flight, the
outcomes of other jobs accumulate and go out together in the next statement, so under load there
is one commit for many jobs and when idle a single outcome is written at once (no timer to wait
for). The backlog is bounded: the worker stops claiming while `concurrency` outcomes are waiting.
Each outcome is fenced by its own lease token; a stale token is reported back as a lost lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from jobbus.store import JobStore, Outcome, Statement
from jobbus.worker.resilience import TRANSIENT_ERRORS, Backoff, Outage

logger = logging.getLogger("jobbus.worker")


@dataclass(slots=True)
class _Round:
    """The outcomes handed in while the previous write was in flight; written together."""

    outcomes: list[Outcome] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)  # monotonic: after this the lease is surely gone
    done: asyncio.Future[set[uuid.UUID]] | None = None


class Completer:
    def __init__(self, store: JobStore, run: Callable[[Statement[set[uuid.UUID]]], Awaitable[set[uuid.UUID]]]):
        self._store = store
        self._run = run
        self._round = _Round()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._outage = Outage("completer")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="jobbus-completer")

    async def write(self, outcome: Outcome, lease_deadline: float) -> bool:
        """Wait until the outcome is durable: True if applied, False if the lease was lost.

        Every outcome of a round waits on one shared future (one allocation per round, not per job);
        the worker never cancels a task in this wait, so the shared future is never cancelled.
        """
        current = self._round
        if current.done is None:
            current.done = asyncio.get_running_loop().create_future()
        current.outcomes.append(outcome)
        current.deadlines.append(lease_deadline)
        self._wakeup.set()
        return outcome.job_id in await current.done

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._round.outcomes:
                current, self._round = self._round, _Round()
                await self._flush(current)
            if self._closing:
                return

    async def _flush(self, current: _Round) -> None:
        done = current.done
        assert done is not None
        outcomes, deadlines = current.outcomes, current.deadlines
        backoff = Backoff()
        while True:
            try:
                applied = await self._run(self._store.record_outcomes(outcomes))
            except TRANSIENT_ERRORS as exc:
                self._outage.failed(exc)
                now = time.monotonic()
                live = [i for i, deadline in enumerate(deadlines) if deadline > now]
                outcomes, deadlines = [outcomes[i] for i in live], [deadlines[i] for i in live]
                if not outcomes:  # every lease is gone: the jobs will be recovered and run again
                    applied = set()
                    break
                await asyncio.sleep(backoff.next_delay())
                continue
            except Exception as exc:  # a bug or a constraint: fail these writes loudly, keep the worker
                logger.exception("writing %d job outcome(s) failed", len(outcomes))
                if not done.done():
                    done.set_exception(exc)
                return
            self._outage.recovered()
            break
        if not done.done():
            done.set_result(applied)
