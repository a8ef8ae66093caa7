"""schedule, jobs list|show|cancel|retry|delete|run-now and prune through the real executable."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobbus.redaction import MASK
from tests.cli import execute, job_status, jobbus, jobbus_json, query_value
from tests.cli.apps import SECRET_MESSAGES
from tests.processes import query


def _schedule(dsn: str, *args: str) -> str:
    result = jobbus(dsn, "schedule", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_schedule_prints_the_id_and_show_json_holds_every_field(dsn: str) -> None:
    at = datetime.now(UTC) + timedelta(hours=2)
    job_id = _schedule(
        dsn,
        "report.render",
        "--config",
        '{"report_id": 42, "pages": [1, 2]}',
        "--queue",
        "reports",
        "--unique-key",
        "report:42",
        "--at",
        at.isoformat(),
        "--priority",
        "7",
        "--max-attempts",
        "5",
        "--name",
        "Quarterly report",
    )
    assert uuid.UUID(job_id).version == 7
    # The same unique key while the first is active gives back the first id.
    assert _schedule(dsn, "report.render", "--unique-key", "report:42") == job_id

    job = jobbus_json(dsn, "jobs", "show", job_id)
    assert job["id"] == job_id
    assert job["type"] == "report.render" and job["queue"] == "reports" and job["name"] == "Quarterly report"
    assert job["status"] == "queued" and job["attempts"] == 0 and job["max_attempts"] == 5
    assert job["priority"] == 7 and job["unique_key"] == "report:42"
    assert job["configuration_data"] == {"report_id": 42, "pages": [1, 2]}
    assert job["execution_data"] == {} and job["result"] is None and job["group_id"] is None
    assert abs(datetime.fromisoformat(job["available_at"]) - at) < timedelta(milliseconds=1)
    datetime.fromisoformat(job["created_at"])
    human = jobbus(dsn, "jobs", "show", job_id)
    assert human.returncode == 0 and "Quarterly report" in human.stdout and "report_id" in human.stdout


def test_schedule_reads_the_configuration_from_stdin(dsn: str) -> None:
    result = jobbus(dsn, "schedule", "noop", "--config", "-", input='{"from": "stdin"}')
    assert result.returncode == 0, result.stderr
    config = query_value(dsn, "SELECT configuration_data FROM jobbus.job WHERE id = %s", result.stdout.strip())
    assert config == {"from": "stdin"}


def test_jobs_list_filters_pages_and_prints_json(dsn: str) -> None:
    ids = [_schedule(dsn, "a.type", "--queue", "q1") for _ in range(3)]
    ids += [_schedule(dsn, "b.type", "--queue", "q2") for _ in range(2)]
    execute(dsn, "UPDATE jobbus.job SET status = 'failed', finished_at = now() WHERE id = %s", ids[4])

    newest = ids[::-1]
    everything = jobbus_json(dsn, "jobs", "list")
    assert [j["id"] for j in everything] == newest  # the newest first, as the dashboard
    assert [j["id"] for j in jobbus_json(dsn, "jobs", "list", "--oldest")] == ids  # creation order
    assert [j["id"] for j in jobbus_json(dsn, "jobs", "list", "--queue", "q1")] == newest[2:]
    assert [j["id"] for j in jobbus_json(dsn, "jobs", "list", "--type", "b.type", "--status", "queued")] == [ids[3]]
    assert [j["id"] for j in jobbus_json(dsn, "jobs", "list", "--status", "failed")] == [ids[4]]
    both = jobbus_json(dsn, "jobs", "list", "--status", "failed", "--status", "queued", "--queue", "q2", "--oldest")
    assert [j["id"] for j in both] == ids[3:]

    first_page = jobbus_json(dsn, "jobs", "list", "--limit", "2", "--oldest")
    second_page = jobbus_json(dsn, "jobs", "list", "--limit", "2", "--oldest", "--after", first_page[-1]["id"])
    assert [j["id"] for j in first_page + second_page] == ids[:4]
    first_page = jobbus_json(dsn, "jobs", "list", "--limit", "2")
    second_page = jobbus_json(dsn, "jobs", "list", "--limit", "2", "--after", first_page[-1]["id"])
    assert [j["id"] for j in first_page + second_page] == newest[:4]

    human = jobbus(dsn, "jobs", "list", "--limit", "2", TZ="UTC")
    assert human.returncode == 0
    assert ids[4] in human.stdout and f"--after {ids[3]}" in human.stdout
    # Times carry their zone: in UTC they end in Z, elsewhere they name the zone.
    created = datetime.fromisoformat(everything[0]["created_at"]).astimezone(UTC)
    assert created.strftime("%Y-%m-%d %H:%M") in human.stdout
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", human.stdout)
    paris = jobbus(dsn, "jobs", "list", "--limit", "1", TZ="Europe/Paris")
    assert paris.returncode == 0 and "Europe/Paris" in paris.stdout


def test_cancel_and_retry(dsn: str) -> None:
    queued = _schedule(dsn, "noop")
    cancelled = jobbus(dsn, "jobs", "cancel", queued)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    assert job_status(dsn, queued) == "cancelled"
    again = jobbus(dsn, "jobs", "cancel", queued)
    assert again.returncode == 0 and "already finished (cancelled)" in again.stdout

    running = _schedule(dsn, "noop")
    execute(dsn, "UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", running)
    requested = jobbus(dsn, "jobs", "cancel", running)
    assert requested.returncode == 0 and "cancellation requested" in requested.stdout
    assert query_value(dsn, "SELECT cancellation_requested_at IS NOT NULL FROM jobbus.job WHERE id = %s", running)

    failed = _schedule(dsn, "noop", "--max-attempts", "2")
    execute(
        dsn,
        "UPDATE jobbus.job SET status = 'failed', attempts = 2, finished_at = now(), last_error = 'x' WHERE id = %s",
        failed,
    )
    retried = jobbus(dsn, "jobs", "retry", failed)
    assert retried.returncode == 0, retried.stderr
    job = jobbus_json(dsn, "jobs", "show", failed)
    assert job["status"] == "queued" and job["attempts"] == 0

    refused = jobbus(dsn, "jobs", "retry", failed)
    assert refused.returncode == 1 and "only failed jobs can be retried" in refused.stderr


def test_delete_and_run_now(dsn: str) -> None:
    later = _schedule(dsn, "noop", "--at", (datetime.now(UTC) + timedelta(hours=3)).isoformat())
    moved = jobbus(dsn, "jobs", "run-now", later)
    assert moved.returncode == 0 and "available now" in moved.stdout, moved.stderr
    assert query_value(dsn, "SELECT available_at <= now() FROM jobbus.job WHERE id = %s", later)

    running = _schedule(dsn, "noop")
    execute(dsn, "UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", running)
    refused = jobbus(dsn, "jobs", "delete", running)
    assert refused.returncode == 1 and "is running" in refused.stderr
    assert job_status(dsn, running) == "running"
    refused = jobbus(dsn, "jobs", "run-now", running)
    assert refused.returncode == 1 and "only queued jobs can be run now" in refused.stderr

    deleted = jobbus(dsn, "jobs", "delete", later)
    assert deleted.returncode == 0 and f"job {later} deleted" in deleted.stdout, deleted.stderr
    assert query_value(dsn, "SELECT count(*) FROM jobbus.job WHERE id = %s", later) == 0
    for verb in ("delete", "run-now"):
        missing = jobbus(dsn, "jobs", verb, later)
        assert missing.returncode == 1 and "does not exist" in missing.stderr, verb
        malformed = jobbus(dsn, "jobs", verb, "not-a-uuid")
        assert malformed.returncode == 64 and "is not a job id" in malformed.stderr, verb


def test_prune_deletes_old_finished_jobs_by_status(dsn: str) -> None:
    def finished(status: str, days_ago: float) -> str:
        job_id = _schedule(dsn, "noop")
        execute(
            dsn,
            "UPDATE jobbus.job SET status = %s, finished_at = now() - make_interval(secs => %s) WHERE id = %s",
            status,
            days_ago * 86400,
            job_id,
        )
        return job_id

    old_completed = finished("completed", 10)
    old_cancelled = finished("cancelled", 8)
    old_failed = finished("failed", 10)
    recent_completed = finished("completed", 1)
    queued = _schedule(dsn, "noop")

    dry = jobbus_json(dsn, "prune", "--older-than", "7d", "--dry-run")
    assert dry["matched"] == 2 and dry["deleted"] == 0
    result = jobbus(dsn, "prune", "--older-than", "7d")
    assert result.returncode == 0, result.stderr
    assert "deleted 2 job(s)" in result.stdout
    assert job_status(dsn, old_completed) is None and job_status(dsn, old_cancelled) is None
    assert job_status(dsn, old_failed) == "failed" and job_status(dsn, recent_completed) == "completed"

    failed = json.loads(jobbus(dsn, "prune", "--older-than", "1w", "--status", "failed", "--json").stdout)
    assert failed["deleted"] == 1 and job_status(dsn, old_failed) is None

    everything = jobbus_json(dsn, "prune", "--older-than", "0s")
    assert everything["deleted"] == 1 and job_status(dsn, recent_completed) is None
    assert job_status(dsn, queued) == "queued"


def _failed_with(dsn: str, job_id: str, *attempts: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    """Make the job failed after these attempts, each (outcome, at, error, traceback), the last one's
    error its `last_error`: written directly, as any release may have written them. Returns its history."""
    history = [
        {"attempt": number, "outcome": outcome, "at": at, "error": error, "traceback": trace}
        for number, (outcome, at, error, trace) in enumerate(attempts, start=1)
    ]
    execute(
        dsn,
        "UPDATE jobbus.job SET status = 'failed', attempts = %s, finished_at = now(), history = %s::jsonb,"
        " last_error = %s WHERE id = %s",
        len(history),
        json.dumps(history),
        history[-1]["error"],
        job_id,
    )
    return history


def test_jobs_show_prints_the_latest_traceback_and_json_has_every_attempts(dsn: str) -> None:
    job_id = _schedule(dsn, "noop", "--max-attempts", "2")
    history = _failed_with(
        dsn,
        job_id,
        (
            "retried",
            "2026-12-02T02:00:00+00:00",
            "ValueError: first",
            'Traceback (most recent call last):\n  File "a.py", line 1, in h\nValueError: first\n',
        ),
        (
            "failed",
            "2026-12-02T02:00:05+00:00",
            "KeyError: 'second'",
            "Traceback (most recent call last):\n  File \"b.py\", line 9, in h\nKeyError: 'second'\n",
        ),
    )
    human = jobbus(dsn, "jobs", "show", job_id, TZ="Europe/Paris")
    assert human.returncode == 0, human.stderr
    assert "traceback of attempt 2:" in human.stdout and 'File "b.py", line 9' in human.stdout
    assert 'File "a.py"' not in human.stdout  # only the latest one
    assert "2026-12-02 03:00:05 Europe/Paris" in human.stdout  # the history's times carry their zone
    shown = jobbus_json(dsn, "jobs", "show", job_id)
    assert [entry["traceback"] for entry in shown["history"]] == [entry["traceback"] for entry in history]


def test_schedule_without_queue_warns_when_live_workers_handle_the_type_elsewhere(dsn: str) -> None:
    execute(
        dsn,
        "INSERT INTO jobbus.worker (id, host, pid, queues, types, concurrency, state, last_seen_at) VALUES "
        "('mailer', 'h1', 1, '{mail}', '{mail.send}', 4, 'running', now()), "
        "('old', 'h1', 2, NULL, '{mail.send}', 4, 'running', now() - interval '1 hour')",
    )
    landed = jobbus(dsn, "schedule", "mail.send")
    assert landed.returncode == 0, landed.stderr
    assert uuid.UUID(landed.stdout.strip())  # stdout stays the id alone
    assert "is in queue default, but the live workers that handle mail.send serve queue mail only" in landed.stderr
    assert "--queue mail" in landed.stderr
    there = jobbus(dsn, "schedule", "mail.send", "--queue", "mail")
    assert there.returncode == 0 and there.stderr == ""
    nobody = jobbus(dsn, "schedule", "pdf.render")  # no live worker handles it anywhere: status says so
    assert nobody.returncode == 0 and nobody.stderr == ""
    execute(dsn, "UPDATE jobbus.worker SET queues = NULL WHERE id = 'mailer'")
    everywhere = jobbus(dsn, "schedule", "mail.send")
    assert everywhere.returncode == 0 and everywhere.stderr == ""


MAIL_APP = "tests.cli.mistaken_apps:app"  # handles mail.welcome, mail.password_reset, report.render


def test_schedule_with_an_app_warns_of_a_type_it_has_no_handler_for_and_schedules_it(dsn: str) -> None:
    result = jobbus(dsn, "schedule", "mail.welcom", "--app", MAIL_APP)
    assert result.returncode == 0, result.stderr
    assert job_status(dsn, result.stdout.strip()) == "queued"  # stdout stays the id alone
    assert result.stderr.splitlines() == [
        f"warning: the app {MAIL_APP} has no handler for mail.welcom (closest: mail.welcome); scheduled anyway"
    ]


def test_without_a_close_type_the_warning_lists_what_the_app_handles(dsn: str) -> None:
    few = jobbus(dsn, "schedule", "invoice.send", "--app", MAIL_APP)
    assert few.returncode == 0 and job_status(dsn, few.stdout.strip()) == "queued"
    assert few.stderr.splitlines() == [
        f"warning: the app {MAIL_APP} has no handler for invoice.send (no close match; it handles "
        "mail.password_reset, mail.welcome, report.render); scheduled anyway"
    ]
    many = jobbus(dsn, "schedule", "invoice.send", "--app", "tests.cli.mistaken_apps:many")
    assert many.returncode == 0 and job_status(dsn, many.stdout.strip()) == "queued"
    assert "it handles batch.step_0, batch.step_1, batch.step_2, batch.step_3, batch.step_4 and 3 more)" in many.stderr


def test_schedule_warns_of_no_type_with_nothing_to_compare_it_with(dsn: str) -> None:
    handled = jobbus(dsn, "schedule", "mail.welcome", "--app", MAIL_APP)
    without_app = jobbus(dsn, "schedule", "mail.welcom")
    producer_app = jobbus(dsn, "schedule", "mail.welcom", "--app", "tests.cli.mistaken_apps:producer")
    for result in (handled, without_app, producer_app):
        assert result.returncode == 0 and result.stderr == ""
        assert job_status(dsn, result.stdout.strip()) == "queued"


def test_schedule_in_a_duration_makes_the_job_available_that_long_after_its_creation(dsn: str) -> None:
    job_id = _schedule(dsn, "noop", "--in", "1h30m")
    delay = query_value(dsn, "SELECT available_at - created_at FROM jobbus.job WHERE id = %s", job_id)
    assert timedelta(hours=1, minutes=30) <= delay < timedelta(hours=1, minutes=30, seconds=5)
    listed = jobbus_json(dsn, "jobs", "list", "--status", "scheduled")
    assert [job["id"] for job in listed] == [job_id]


def test_schedule_in_zero_seconds_is_available_now(dsn: str) -> None:
    job_id = _schedule(dsn, "noop", "--in", "0s")
    assert query_value(dsn, "SELECT available_at <= now() FROM jobbus.job WHERE id = %s", job_id) is True


def test_no_secret_a_handler_raises_is_stored_printed_or_logged(dsn: str) -> None:
    ids = [
        _schedule(dsn, "leak_shapes", "--config", json.dumps({"case": case}), "--max-attempts", "2")
        for case in range(len(SECRET_MESSAGES))
    ]
    worker = jobbus(dsn, "worker", "--app", "tests.cli.apps:app", "--stop-when-empty", "--log-level", "DEBUG")
    assert worker.returncode == 0, worker.stderr[-3000:]
    secrets = re.findall(r"\bSV\w+", " ".join(SECRET_MESSAGES))
    assert len(secrets) == 12
    seen = [worker.stdout, worker.stderr]
    rows = query(dsn, "SELECT status, last_error, error_group, history FROM jobbus.job WHERE id = ANY(%s)", (ids,))
    for status, last_error, group, history in rows:
        assert status == "failed" and [entry["outcome"] for entry in history] == ["retried", "failed"]
        assert MASK in last_error and len(last_error.encode()) <= 4096
        assert all(len(entry["traceback"].encode()) <= 16 * 1024 for entry in history)
        seen += [last_error, group, *(entry["error"] for entry in history), *(entry["traceback"] for entry in history)]
    for job_id in ids:
        shown = jobbus(dsn, "jobs", "show", job_id)
        assert shown.returncode == 0 and "traceback of attempt 2:" in shown.stdout, shown.stderr
        seen.append(shown.stdout)
    seen += [jobbus(dsn, "jobs", "show", job_id, "--json").stdout for job_id in (ids[0], ids[-1])]
    seen += [jobbus(dsn, "jobs", "list").stdout, jobbus(dsn, "jobs", "list", "--json").stdout]  # every history
    assert [secret for secret in secrets if any(secret in text for text in seen)] == []


def test_errors_stored_in_clear_by_an_earlier_release_are_masked_when_printed(dsn: str) -> None:
    job_id = _schedule(dsn, "noop", "--max-attempts", "1")
    trace = "Traceback (most recent call last):\nValueError: token=SVold01\n"
    _failed_with(dsn, job_id, ("failed", "2026-12-02T02:00:00+00:00", "ValueError: token=SVold01", trace))
    for args in (["jobs", "show", job_id], ["jobs", "list"], ["jobs", "list", "--status", "failed"]):
        result = jobbus(dsn, *args)
        assert result.returncode == 0 and "token=" in result.stdout and "SVold01" not in result.stdout, args
    for document in (jobbus_json(dsn, "jobs", "show", job_id), *jobbus_json(dsn, "jobs", "list")):
        assert document["last_error"] == f"ValueError: token={MASK}"
        assert document["history"][0]["error"] == f"ValueError: token={MASK}"
        assert document["history"][0]["traceback"].endswith(f"ValueError: token={MASK}\n")


def test_jobs_show_logs_prints_each_attempts_lines_and_json_has_them(dsn: str) -> None:
    job_id = _schedule(dsn, "noop", "--max-attempts", "2")
    history = [
        {
            "attempt": 1,
            "outcome": "retried",
            "at": "2026-12-02T02:00:01+00:00",
            "error": "ValueError: first",
            "logs": [
                {"at": "2026-12-02T02:00:00.250000+00:00", "level": "INFO", "message": "fetching page 1"},
                {"at": "2026-12-02T02:00:00.500000+00:00", "level": "ERROR", "message": "gave up\nTraceback: x"},
            ],
            "logs_dropped": 12,
        },
        {"attempt": 2, "outcome": "completed", "at": "2026-12-02T02:00:05+00:00"},
        {
            "attempt": 3,
            "outcome": "completed",
            "at": "2026-12-02T02:00:09+00:00",
            "logs": [{"at": "2026-12-02T02:00:08+00:00", "level": "WARNING", "message": "[bold]x[/bold]\x1b[31m"}],
        },
    ]
    execute(dsn, "UPDATE jobbus.job SET history = %s::jsonb WHERE id = %s", json.dumps(history), job_id)
    plain = jobbus(dsn, "jobs", "show", job_id, TZ="UTC")
    assert plain.returncode == 0, plain.stderr
    assert "fetching page 1" not in plain.stdout  # only with --logs
    human = jobbus(dsn, "jobs", "show", job_id, "--logs", TZ="UTC")
    assert human.returncode == 0, human.stderr
    out = human.stdout
    assert "logs of attempt 1 (retried):" in out and "(12 earlier lines dropped" in out
    assert "2026-12-02 02:00:00.250 INFO     fetching page 1" in out
    assert "ERROR    gave up\n    Traceback: x" in out
    assert "logs of attempt 2" not in out  # it logged nothing
    assert "WARNING  [bold]x[/bold]\\x1b[31m" in out  # data, never markup or a terminal escape
    assert out.index("logs of attempt 1") < out.index("logs of attempt 3")
    shown = jobbus_json(dsn, "jobs", "show", job_id, "--logs")
    assert [entry.get("logs") for entry in shown["history"]] == [entry.get("logs") for entry in history]
