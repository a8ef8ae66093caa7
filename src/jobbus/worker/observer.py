"""What a worker tells observers (Prometheus metrics, tracing) about its jobs, from its own counters.

Observers are called in the worker's event loop and must be quick; one that raises is logged once and
never affects the job or the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from jobbus.models import ClaimedJob
from jobbus.store import QueueSample

logger = logging.getLogger("jobbus.worker")


class WorkerObserver(Protocol):
    def job_claimed(self, job: ClaimedJob, waited_seconds: float) -> None:
        """A job was leased; it had been available for `waited_seconds`."""

    def job_finished(self, job: ClaimedJob, outcome: str, seconds: float) -> None:
        """An attempt ended: `outcome` is one of `outcomes.OUTCOME_KINDS`, or `lost` (nothing was written);
        its handler ran for `seconds`."""

    def queues_sampled(self, samples: Sequence[QueueSample]) -> None:
        """This worker leads and has just sampled every queue of the fleet (one statement for all)."""

    def leadership_changed(self, is_leader: bool) -> None:
        """This worker became the leader, or stopped being it (its queue samples are then stale)."""


class Observers:
    """The worker's observers, each shielded from the others and from the worker."""

    def __init__(self, observers: Sequence[WorkerObserver]) -> None:
        self._observers = list(observers)
        self._failed: set[int] = set()
        #: Whether there is any observer (a metrics port, a drain's counts): without one, nothing per job.
        self.active = bool(self._observers)

    def __bool__(self) -> bool:
        return self.active

    def claimed(self, job: ClaimedJob, waited_seconds: float) -> None:
        for observer in self._observers:
            try:
                observer.job_claimed(job, waited_seconds)
            except Exception:
                self._log(observer)

    def finished(self, job: ClaimedJob, outcome: str, seconds: float) -> None:
        for observer in self._observers:
            try:
                observer.job_finished(job, outcome, seconds)
            except Exception:
                self._log(observer)

    def queues_sampled(self, samples: Sequence[QueueSample]) -> None:
        for observer in self._observers:
            try:
                observer.queues_sampled(samples)
            except Exception:
                self._log(observer)

    def leadership_changed(self, is_leader: bool) -> None:
        for observer in self._observers:
            try:
                observer.leadership_changed(is_leader)
            except Exception:
                self._log(observer)

    def _log(self, observer: WorkerObserver) -> None:
        if id(observer) not in self._failed:
            self._failed.add(id(observer))
            logger.exception("worker observer %r failed (logged once; the job is not affected)", observer)
