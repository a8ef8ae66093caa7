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


UNHANDLED_JOBS = """
INSERT INTO jobbus.job (id, type, queue, status, max_attempts, available_at)
SELECT jobbus.uuid_generate_v7(), type, queue, 'queued', 3, now() + later
FROM (VALUES ('mail', 'mail.send', interval '0'), ('mail', 'mail.send', interval '0'),
             ('mail', 'mail.sned', interval '0'), ('mail', 'mail.sned', interval '1 day'),
             ('pdf', 'pdf.render', interval '0'), ('reports', 'report.render', interval '0')) AS v(queue, type, later)
"""


def test_status_names_queued_work_no_live_worker_can_take(dsn: str) -> None:
    execute(dsn, UNHANDLED_JOBS)
    # No worker alive: everything queued is unhandled.
    status = jobbus_json(dsn, "status")
    assert status["unhandled"] == [
        {"queue": "mail", "type": "mail.send", "queued": 2},
        {"queue": "mail", "type": "mail.sned", "queued": 2},
        {"queue": "pdf", "type": "pdf.render", "queued": 1},
        {"queue": "reports", "type": "report.render", "queued": 1},
    ]
    human = jobbus(dsn, "status")
    assert human.returncode == 0 and "no worker is alive" in human.stdout
    execute(
        dsn,
        "INSERT INTO jobbus.worker (id, host, pid, queues, types, concurrency, state, last_seen_at) VALUES "
        "('mailer', 'h1', 1, '{mail}', '{mail.send,pdf.render}', 4, 'paused', now()), "
        "('any-queue', 'h1', 2, NULL, '{report.render}', 4, 'running', now()), "
        "('gone', 'h2', 3, NULL, '{pdf.render,mail.sned}', 4, 'running', now() - interval '1 hour'), "
        "('stopped', 'h2', 4, NULL, '{pdf.render,mail.sned}', 4, 'stopped', now())",
    )
    # A typo'd type in a served queue, and a handled type in a queue no live worker serves.
    status = jobbus_json(dsn, "status")
    assert status["unhandled"] == [
        {"queue": "mail", "type": "mail.sned", "queued": 2},
        {"queue": "pdf", "type": "pdf.render", "queued": 1},
    ]
    human = jobbus(dsn, "status")
    assert human.returncode == 0
    assert "warning: queued jobs nobody can take (no live worker handles them)" in human.stdout
    assert "2 of type mail.sned in queue mail" in human.stdout and "1 of type pdf.render in queue pdf" in human.stdout
    execute(dsn, "DELETE FROM jobbus.job WHERE type IN ('mail.sned', 'pdf.render')")
    assert jobbus_json(dsn, "status")["unhandled"] == []
    assert "nobody can take" not in jobbus(dsn, "status").stdout


def test_a_live_worker_process_takes_its_types_off_the_list_and_warns_of_a_periodic_typo(dsn: str) -> None:
    execute(dsn, UNHANDLED_JOBS)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobbus",
            "worker",
            "--app",
            "tests.cli.apps:typo_app",
            "--worker-id",
            "typo",
            "--queue",
            "reports",
            "--queue",
            "mail",
        ],
        cwd=ROOT,
        env=cli_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: query_value(dsn, "SELECT count(*) FROM jobbus.worker WHERE id = 'typo' AND state = 'running'"),
            what="the worker registered",
        )
        unhandled = {(u["queue"], u["type"]) for u in jobbus_json(dsn, "status")["unhandled"]}
        # It handles reports.render only: report.render (the periodic's typo) is nobody's.
        assert unhandled == {
            ("mail", "mail.send"),
            ("mail", "mail.sned"),
            ("pdf", "pdf.render"),
            ("reports", "report.render"),
        }
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
    assert worker.returncode == 0, output
    warning = next(line for line in output.splitlines() if "nightly-report" in line and "WARNING" in line)
    assert "type report.render, which no handler of this worker serves" in warning
