"""Data is shown as written: never read as rich markup, and never sent to the terminal as control codes.

Every human view (status, workers, jobs list, jobs show, schedule, prune) gets job types, queues,
names, keys, configurations, errors, results and worker ids that look like markup or carry escape
sequences.
"""

from __future__ import annotations

import json

import pytest

import jobbus
from jobbus.cli.text import visible
from tests.cli import execute, jobbus_json
from tests.cli import jobbus as run_jobbus

HOSTILE = [
    "[/]",
    "[bold]x",
    "[INST] Summarise this [/INST]",
    "pod[/]1",
    "[link=https://x.invalid]a[/link]",
    ":thumbs_up:",
    "\x1b[31mred\x1b[0m",
    "\x1b]8;;https://x.invalid\x07a\x1b]8;;\x07",
    "\u202eevil",
    "\x9b31mcsi",
]
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e")
WIDE = "400"  # columns: no cell is cut short, so each value can be found whole


@pytest.fixture
def hostile_dsn(dsn: str) -> str:
    """One job and one worker per hostile string, in every field they have; one paused hostile queue."""
    app = jobbus.App(dsn=dsn)
    with app.sync:
        for text in HOSTILE:
            job_id = app.sync.schedule(
                text,
                {text: text, "prompt": text},
                queue=text,
                name=text,
                unique_key=text,
            )
            execute(
                dsn,
                "UPDATE jobbus.job SET status = 'failed', finished_at = now(), attempts = 3, last_error = %s,"
                " worker_id = %s, result = %s WHERE id = %s",
                f"RuntimeError: {text}",
                text,
                json.dumps({"answer": text}),
                job_id,
            )
            execute(
                dsn,
                "INSERT INTO jobbus.worker (id, host, pid, queues, concurrency, state, last_seen_at)"
                " VALUES (%s, %s, 1, ARRAY[%s], 4, 'running', now())",
                text,
                text,
                text,
            )
    execute(dsn, "INSERT INTO jobbus.pause (target_kind, target) VALUES ('queue', %s)", HOSTILE[0])
    return dsn


def _assert_shown_as_written(stdout: str, *, at_least: int = 1) -> None:
    for text in HOSTILE:
        assert stdout.count(visible(text)) >= at_least, (text, stdout)
    assert "👍" not in stdout  # not read as an emoji code either
    for control in RAW_CONTROLS:
        assert control not in stdout, (control, stdout)


@pytest.mark.parametrize(
    ("args", "at_least"),
    [
        (["status"], 1),
        (["workers"], 3),  # id, host and queues
        (["jobs", "list"], 3),  # type, queue and last error
        (["jobs", "list", "--status", "failed", "--limit", "100"], 3),
    ],
    ids=["status", "workers", "jobs-list", "jobs-list-filtered"],
)
def test_tables_show_data_as_written(hostile_dsn: str, args: list[str], at_least: int) -> None:
    result = run_jobbus(hostile_dsn, *args, COLUMNS=WIDE)
    assert result.returncode == 0, result.stderr
    _assert_shown_as_written(result.stdout, at_least=at_least)


def test_jobs_show_shows_every_field_as_written(hostile_dsn: str) -> None:
    for job in jobbus_json(hostile_dsn, "jobs", "list"):
        result = run_jobbus(hostile_dsn, "jobs", "show", job["id"], COLUMNS=WIDE)
        assert result.returncode == 0, result.stderr
        text = job["type"]
        # type, queue, name, unique key, worker and last error as rows; the configuration and the
        # result as JSON, where a control character is written as a JSON escape.
        assert result.stdout.count(visible(text)) >= 6, result.stdout
        shown_json = visible(json.dumps(text, ensure_ascii=False)[1:-1])
        assert result.stdout.count(shown_json) >= 4, result.stdout  # key, value, prompt, result
        for control in RAW_CONTROLS:
            assert control not in result.stdout


def test_json_output_keeps_the_data_exactly(hostile_dsn: str) -> None:
    jobs = jobbus_json(hostile_dsn, "jobs", "list")
    assert sorted(job["type"] for job in jobs) == sorted(HOSTILE)
    for job in jobs:
        assert job["configuration_data"] == {job["type"]: job["type"], "prompt": job["type"]}
    assert sorted(w["id"] for w in jobbus_json(hostile_dsn, "workers")) == sorted(HOSTILE)


@pytest.mark.parametrize("text", HOSTILE)
def test_schedule_and_prune_take_hostile_data(dsn: str, text: str) -> None:
    scheduled = run_jobbus(dsn, "schedule", text, "--queue", text, "--config", json.dumps({text: text}))
    assert scheduled.returncode == 0, scheduled.stderr
    job = jobbus_json(dsn, "jobs", "show", scheduled.stdout.strip())
    assert (job["type"], job["queue"], job["configuration_data"]) == (text, text, {text: text})
    execute(dsn, "UPDATE jobbus.job SET status = 'completed', finished_at = now() - interval '1 hour'")
    pruned = run_jobbus(dsn, "prune", "--older-than", "1m")
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 1 job(s)" in pruned.stdout
