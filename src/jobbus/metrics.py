"""Prometheus metrics of a worker (extra `metrics`): its own counters, and the leader's queue samples.

Every job metric is counted by the worker as it claims and finishes jobs, in its event loop: a scrape
reads memory and never queries the database. The queue gauges (`jobbus_queue_jobs`,
`jobbus_queue_oldest_available_seconds`) come from the leader's sampling, which reads every queue of
the fleet in one statement per `stats_interval_seconds`; only the worker that leads exposes them (a
follower's series disappear when it loses leadership), so aggregate them with `max by (queue, status)`
across instances. No label carries a job id: the cardinality is queues × types × outcomes.

    metrics = jobbus.metrics.PrometheusMetrics()
    server = metrics.serve(9464)                     # /metrics on 127.0.0.1:9464
    worker = jobbus.Worker(app, observers=[metrics])
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Sequence
from typing import Any

from jobbus.models import ClaimedJob
from jobbus.store import QueueSample

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("jobbus.metrics needs prometheus-client: pip install 'jobbus[metrics]'") from exc

#: From 5 ms to one hour: quick handlers and hour-long reports land in buckets of their own.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
#: The outcomes `jobbus_jobs_finished_total` counts (SPEC 14). An attempt whose lease was lost before its
#: outcome was written is counted by `jobbus_jobs_lost_total` instead: nothing was recorded for it.
FINISHED_OUTCOMES = ("completed", "retried", "failed", "cancelled", "released", "snoozed", "timed_out")
#: What `jobbus_queue_jobs{status}` reports of each queue.
QUEUE_STATUSES = ("available", "scheduled", "running")


class PrometheusMetrics:
    """A worker observer that keeps the SPEC 14 metrics in its own registry (no global state)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, cells: bool = False) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        #: Serving cells, every series has a `cell` label first; `for_cell(name)` observes one cell's worker.
        self.cells = cells
        self._cell: tuple[str, ...] = ()
        first = ("cell",) if cells else ()
        labels = (*first, "queue", "type")
        self.claimed = Counter("jobbus_jobs_claimed", "Jobs this worker leased.", labels, registry=self.registry)
        self.finished = Counter(
            "jobbus_jobs_finished",
            "Attempts this worker ended, by outcome.",
            (*labels, "outcome"),
            registry=self.registry,
        )
        self.lost = Counter(
            "jobbus_jobs_lost",
            "Attempts whose lease was lost before their outcome was written (another worker has the job).",
            labels,
            registry=self.registry,
        )
        self.duration = Histogram(
            "jobbus_job_duration_seconds",
            "How long handlers ran, per attempt.",
            labels,
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.wait = Histogram(
            "jobbus_job_wait_seconds",
            "How long jobs waited between becoming available and being claimed.",
            labels,
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.running = Gauge(
            "jobbus_jobs_running", "Attempts in flight in this worker.", (*first, "queue"), registry=self.registry
        )
        self.queue_jobs = Gauge(
            "jobbus_queue_jobs",
            "Jobs of each queue, fleet-wide, from the leader's latest sample (status: available, scheduled, running).",
            (*first, "queue", "status"),
            registry=self.registry,
        )
        self.queue_oldest = Gauge(
            "jobbus_queue_oldest_available_seconds",
            "Age of the oldest job available to claim, fleet-wide, from the leader's latest sample.",
            (*first, "queue"),
            registry=self.registry,
        )
        self._sampled_queues: set[str] = set()

    def for_cell(self, cell: str) -> PrometheusMetrics:
        """The observer of one cell's worker: the same series, with `cell` set to `cell`."""
        if not self.cells:
            raise ValueError("for_cell: these metrics have no cell label; make them with PrometheusMetrics(cells=True)")
        view = copy.copy(self)
        view._cell = (cell,)
        view._sampled_queues = set()
        return view

    # -- the worker observer ------------------------------------------------------------------------

    def job_claimed(self, job: ClaimedJob, waited_seconds: float) -> None:
        self.claimed.labels(*self._cell, job.queue, job.type).inc()
        self.wait.labels(*self._cell, job.queue, job.type).observe(waited_seconds)
        self.running.labels(*self._cell, job.queue).inc()

    def job_finished(self, job: ClaimedJob, outcome: str, seconds: float) -> None:
        self.running.labels(*self._cell, job.queue).dec()
        self.duration.labels(*self._cell, job.queue, job.type).observe(seconds)
        if outcome in FINISHED_OUTCOMES:
            self.finished.labels(*self._cell, job.queue, job.type, outcome).inc()
        else:
            self.lost.labels(*self._cell, job.queue, job.type).inc()

    def queues_sampled(self, samples: Sequence[QueueSample]) -> None:
        """Replace the queue gauges with the leader's latest sample; queues absent from it are dropped."""
        current = {s.queue for s in samples}
        for queue in self._sampled_queues - current:
            self._forget(queue)
        for sample in samples:
            self.queue_jobs.labels(*self._cell, sample.queue, "available").set(sample.available)
            self.queue_jobs.labels(*self._cell, sample.queue, "scheduled").set(sample.scheduled)
            self.queue_jobs.labels(*self._cell, sample.queue, "running").set(sample.running)
            if sample.oldest_available_seconds is None:
                self.queue_oldest.labels(*self._cell, sample.queue).set(0)
            else:
                self.queue_oldest.labels(*self._cell, sample.queue).set(sample.oldest_available_seconds)
        self._sampled_queues = current

    def leadership_changed(self, is_leader: bool) -> None:
        if not is_leader:
            for queue in self._sampled_queues:
                self._forget(queue)
            self._sampled_queues = set()

    def _forget(self, queue: str) -> None:
        for status in QUEUE_STATUSES:
            self._remove(self.queue_jobs, *self._cell, queue, status)
        self._remove(self.queue_oldest, *self._cell, queue)

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)

    # -- serving ------------------------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve `/metrics` on host:port from a daemon thread; `close()` the result to stop it."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return MetricsServer(server, thread)


class MetricsServer:
    """The HTTP server of `PrometheusMetrics.serve`."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


__all__ = ["BUCKETS", "MetricsServer", "PrometheusMetrics"]
