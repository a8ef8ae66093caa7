"""status and workers: the numbers in --json, gone workers, --watch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.cli import ROOT, cli_env, execute, jobbus, jobbus_json, query_value, wait_until

JOBS = """
INSERT INTO jobbus.job (id, type, queue, status, max_attempts, available_at, finished_at)
SELECT jobbus.uuid_generate_v7(), 't', queue, status, 3, now() + available, now() - finished
FROM (VALUES
    ('mail', 'queued',    interval '-10 minutes', NULL),
    ('mail', 'queued',    interval '-1 minute',   NULL),
    ('mail', 'queued',    interval '1 hour',      NULL),
    ('mail', 'running',   interval '0',           NULL),
    ('mail', 'completed', interval '0',           interval '10 seconds'),
    ('mail', 'completed', interval '0',           interval '20 seconds'),
    ('mail', 'completed', interval '0',           interval '2 hours'),
    ('mail', 'failed',    interval '0',           interval '30 minutes'),
    ('mail', 'failed',    interval '0',           interval '3 hours'),
    ('mail', 'cancelled', interval '0',           interval '1 minute'),
    ('pdf',  'queued',    interval '0',           NULL)
) AS v(queue, status, available, finished)
"""

WORKERS = """
INSERT INTO jobbus.worker (id, host, pid, queues, concurrency, state, in_flight, completed, failed,
                           last_seen_at, stopped_at)
VALUES ('live', 'h1', 11, NULL, 10, 'running', 3, 40, 2, now(), NULL),
       ('paused', 'h1', 12, '{mail}', 5, 'paused', 0, 1, 0, now(), NULL),
       ('dead', 'h2', 13, '{pdf}', 4, 'running', 1, 7, 1, now() - interval '1 hour', NULL),
       ('done', 'h2', 14, NULL, 4, 'stopped', 0, 9, 0, now() - interval '1 hour', now() - interval '1 hour'),
       ('ancient', 'h3', 15, NULL, 4, 'stopped', 0, 9, 0, now() - interval '3 days', now() - interval '3 days'),
       ('long-dead', 'h3', 16, NULL, 4, 'running', 0, 9, 0, now() - interval '2 days', NULL)
"""


def test_status_json_counts_per_queue_and_summarises_workers(dsn: str) -> None:
    execute(dsn, JOBS)
    execute(dsn, WORKERS)
    execute(dsn, "INSERT INTO jobbus.pause (target_kind, target) VALUES ('queue', 'idle')")
    status = jobbus_json(dsn, "status")
    queues = {q["queue"]: q for q in status["queues"]}
    assert list(queues) == ["idle", "mail", "pdf"]
    mail = queues["mail"]
    assert (mail["queued"], mail["available"], mail["scheduled"]) == (3, 2, 1)
    assert (mail["running"], mail["completed"], mail["failed"], mail["cancelled"]) == (1, 3, 2, 1)
    assert mail["completed_last_minute"] == 2 and mail["failed_last_hour"] == 1
    assert 600 <= mail["oldest_waiting_seconds"] < 700
    assert mail["paused"] is False and queues["idle"]["paused"] is True and queues["idle"]["total"] == 0
    assert status["totals"]["queued"] == 4 and status["totals"]["total"] == 11
    workers = status["workers"]
    assert (workers["live"], workers["gone"], workers["stopped"]) == (2, 1, 1)
    assert (workers["running"], workers["paused"], workers["in_flight"], workers["capacity"]) == (1, 1, 3, 15)
    assert status["paused"] == {"all": False, "queues": ["idle"], "workers": []}

    human = jobbus(dsn, "status")
    assert human.returncode == 0
    assert "mail" in human.stdout and "idle (paused)" in human.stdout and "2 live" in human.stdout


def test_workers_lists_gone_workers_and_forgets_old_rows(dsn: str) -> None:
    execute(dsn, WORKERS)
    workers = {w["id"]: w for w in jobbus_json(dsn, "workers")}
    assert sorted(workers) == ["dead", "done", "live", "paused"]  # 'ancient' and 'long-dead' forgotten
    assert query_value(dsn, "SELECT count(*) FROM jobbus.worker") == 4
    assert workers["dead"]["state"] == "gone" and workers["dead"]["gone"] is True
    assert workers["done"]["state"] == "stopped" and workers["done"]["gone"] is False
    live = workers["live"]
    assert (live["state"], live["host"], live["pid"], live["queues"]) == ("running", "h1", 11, None)
    assert (live["in_flight"], live["completed"], live["failed"], live["done"]) == (3, 40, 2, 42)
    assert workers["paused"]["queues"] == ["mail"]
    assert [w["id"] for w in jobbus_json(dsn, "workers", "--live")] == ["live", "paused"]

    human = jobbus(dsn, "workers")
    assert human.returncode == 0 and "gone" in human.stdout and "stopped" in human.stdout


def test_a_worker_is_gone_by_its_own_lease_not_by_the_cli_settings(dsn: str) -> None:
    execute(
        dsn,
        "INSERT INTO jobbus.worker (id, host, pid, concurrency, last_seen_at, lease_seconds, dead_after_seconds) "
        "VALUES ('short', 'h', 1, 1, now() - interval '5 seconds', 2, 15), "
        "       ('long', 'h', 2, 1, now() - interval '5 seconds', 300, 3600)",
    )
    for lease in ("300", "2", "600"):
        result = jobbus(dsn, "workers", "--json", JOBBUS_LEASE_SECONDS=lease)
        states = {w["id"]: w["state"] for w in json.loads(result.stdout)}
        assert states == {"short": "gone", "long": "running"}, lease


def test_status_watch_refreshes_until_ctrl_c_then_exits_0(dsn: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "status", "--watch", "--interval", "0.2"],
        cwd=ROOT,
        env=cli_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        wait_until(
            lambda: query_value(dsn, others) >= 1,
            what="status --watch connected",
        )
        time.sleep(0.5)  # a few refreshes
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "workers: 0 live" in out
