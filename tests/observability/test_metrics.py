"""Prometheus metrics of a real worker process match the job table; queue gauges come from the leader."""

from __future__ import annotations

import signal
import socket
import urllib.request
from collections import Counter
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

import jobbus
from jobbus.metrics import BUCKETS, PrometheusMetrics
from jobbus.models import ClaimedJob
from jobbus.store import QueueSample
from tests.processes import finish, query, start_worker, wait_until

APP = "tests.observability.apps:app"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and all((k, v) in sample_labels for k, v in labels.items())
    )


def test_metrics_scraped_from_a_worker_after_a_drain_match_the_job_table(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    with app.sync:
        app.sync.schedule_many("ok", [{"to": f"u{n}"} for n in range(6)])
        app.sync.schedule_many("flaky", [{} for _ in range(3)], queue="mail")
        app.sync.schedule_many("broken", [{"report": n} for n in range(2)], max_attempts=2)
    port = free_port()
    env = {"JOBBUS_STATS_INTERVAL_SECONDS": "0.2"}
    proc = start_worker(dsn, "--metrics-port", str(port), env=env, app=APP)
    try:
        wait_until(
            lambda: query(dsn, "SELECT count(*) FROM jobbus.job WHERE status IN ('queued', 'running')")[0][0] == 0,
            what="every job finished",
        )
        outcomes = Counter(
            {
                row[0]: row[1]
                for row in query(
                    dsn,
                    "SELECT h->>'outcome', count(*) FROM jobbus.job, jsonb_array_elements(history) AS h GROUP BY 1",
                )
            }
        )
        attempts = query(dsn, "SELECT sum(attempts) FROM jobbus.job")[0][0]
        assert outcomes == {"completed": 9, "retried": 5, "failed": 2}

        def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            samples = scrape(port)
            done = total(samples, "jobbus_jobs_finished_total")
            return samples if done == sum(outcomes.values()) else None

        samples = wait_until(settled, what="the last outcomes counted")
        for outcome, count in outcomes.items():
            assert total(samples, "jobbus_jobs_finished_total", outcome=outcome) == count, outcome
        assert total(samples, "jobbus_jobs_finished_total", type="broken", outcome="failed") == 2
        assert total(samples, "jobbus_jobs_finished_total", queue="mail", type="flaky", outcome="retried") == 3
        assert total(samples, "jobbus_jobs_claimed_total") == attempts
        assert total(samples, "jobbus_job_duration_seconds_count") == attempts
        assert total(samples, "jobbus_job_wait_seconds_count") == attempts
        assert total(samples, "jobbus_job_duration_seconds_bucket", le="0.005") >= 0
        assert total(samples, "jobbus_job_duration_seconds_bucket", le="3600.0") == attempts
        assert total(samples, "jobbus_jobs_running") == 0
        assert not any("id" in dict(labels) for _, labels in samples)

        # The queue gauges come from the leader's samples (this worker leads: it is alone).
        with app.sync:
            app.sync.schedule_many("ok", [{} for _ in range(4)], queue="mail", available_at=timedelta(hours=1))
        wait_until(
            lambda: total(scrape(port), "jobbus_queue_jobs", queue="mail", status="scheduled") == 4,
            what="the scheduled gauge",
        )
        samples = scrape(port)
        assert total(samples, "jobbus_queue_jobs", queue="mail", status="available") == 0
        assert ("jobbus_queue_oldest_available_seconds", (("queue", "mail"),)) in samples
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
    assert code == 0, out
    assert f"metrics on http://127.0.0.1:{port}/metrics" in out


def _job(queue: str = "q", type: str = "t") -> ClaimedJob:
    import uuid
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    return ClaimedJob(uuid.uuid4(), type, queue, None, None, 0, {}, {}, 1, 3, uuid.uuid4(), False, now, now)


def _value(metrics: PrometheusMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_buckets_span_five_milliseconds_to_one_hour() -> None:
    assert BUCKETS[0] == 0.005 and BUCKETS[-1] == 3600


def test_a_lost_lease_is_not_an_outcome_and_the_running_gauge_returns_to_zero() -> None:
    metrics = PrometheusMetrics()
    job = _job()
    metrics.job_claimed(job, 0.5)
    assert _value(metrics, "jobbus_jobs_running", {"queue": "q"}) == 1
    metrics.job_finished(job, "lost", 0.1)
    assert _value(metrics, "jobbus_jobs_running", {"queue": "q"}) == 0
    assert _value(metrics, "jobbus_jobs_lost_total", {"queue": "q", "type": "t"}) == 1
    assert _value(metrics, "jobbus_jobs_finished_total", {"queue": "q", "type": "t", "outcome": "lost"}) is None


def test_queue_gauges_follow_the_latest_sample_and_vanish_with_leadership() -> None:
    metrics = PrometheusMetrics()
    metrics.queues_sampled([QueueSample("a", 3, 1, 2, 0, 0, 0, 12.5), QueueSample("b", 0, 0, 1, 0, 0, 0, None)])
    assert _value(metrics, "jobbus_queue_jobs", {"queue": "a", "status": "available"}) == 3
    assert _value(metrics, "jobbus_queue_oldest_available_seconds", {"queue": "a"}) == 12.5
    metrics.queues_sampled([QueueSample("a", 1, 0, 0, 0, 0, 0, 1.0)])
    assert _value(metrics, "jobbus_queue_jobs", {"queue": "b", "status": "running"}) is None
    metrics.leadership_changed(False)
    assert _value(metrics, "jobbus_queue_jobs", {"queue": "a", "status": "available"}) is None


def test_metrics_port_in_use_is_a_usage_error(dsn: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = start_worker(dsn, "--metrics-port", str(port), app=APP)
        code, out = finish(proc)
    assert code == 64, out
    assert "--metrics-port" in out


pytestmark = pytest.mark.timeout(120)


def test_the_grafana_dashboard_uses_only_metrics_that_exist() -> None:
    import json
    import re

    from tests.processes import ROOT

    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    names: set[str] = set()
    for family in PrometheusMetrics().registry.collect():
        names.update(sample_name for sample_name in (family.name, f"{family.name}_total", f"{family.name}_bucket"))
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bjobbus_[a-z_]+", target["expr"])
    }
    assert used and used <= names, used - names


def test_a_queue_that_goes_idle_gets_one_sample_of_zeros(dsn: str) -> None:
    import psycopg

    from jobbus.store import MaintenanceStore, run_sync
    from jobbus.worker.services.queue_stats import LATE_SECONDS, TALLY_SECONDS

    statement = MaintenanceStore("jobbus").sample_queues(1.0, late_seconds=LATE_SECONDS, keep_seconds=TALLY_SECONDS)
    app = jobbus.App(dsn=dsn)
    with app.sync:
        (job_id,) = app.sync.schedule_many("ok", [{}], queue="idle-soon")
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = run_sync(conn, statement)
        assert [(s.queue, s.available) for s in first] == [("idle-soon", 1)]
        conn.execute("UPDATE jobbus.job SET status = 'cancelled', finished_at = now() WHERE id = %s", (job_id,))
        second = run_sync(conn, statement)
        assert [(s.queue, s.available, s.cancelled) for s in second] == [("idle-soon", 0, 1)]
        third = run_sync(conn, statement)
        assert [(s.queue, s.available, s.cancelled) for s in third] == [("idle-soon", 0, 0)]
        assert run_sync(conn, statement) == []
