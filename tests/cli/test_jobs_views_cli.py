"""`jobbus jobs list` over the views: one --status lists every matching job in its view's order, page
after page (`--after` what the page printed), filtered by name and text; the JSON says when a queued job
runs next, what a parked one waits for, and names a retrying job so."""

from __future__ import annotations

import json

import psycopg

from tests.cli import jobbus, jobbus_json


def _fill(dsn: str) -> None:
    """20,000 jobs scheduled an hour ahead (in reverse id order), a few retrying, parked and finished."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, available_at, configuration_data)"
            " SELECT jobbus.uuid_generate_v7(), 'report', 'reports', 3,"
            " now() + interval '1 hour' + (20000 - n) * interval '10 ms', jsonb_build_object('sku', 'sku-' || n)"
            " FROM generate_series(1, 20000) AS n"
        )
        conn.execute(
            "INSERT INTO jobbus.job (id, type, max_attempts, attempts, available_at, last_error, history)"
            " SELECT jobbus.uuid_generate_v7(), 'mail', 3, 1, now() + n * interval '1 min', 'smtp: 421 try later',"
            ' \'[{"attempt": 1, "outcome": "retried"}]\' FROM generate_series(1, 3) AS n'
        )
        conn.execute(
            "INSERT INTO jobbus.job (id, type, name, max_attempts, available_at, history) VALUES"
            " (jobbus.uuid_generate_v7(), 'flow', 'order-7', 3, '9000-01-01',"
            ' \'[{"attempt": 1, "outcome": "waiting", "waiting_for": "event order:7:paid"}]\')'
        )
        conn.execute("ANALYZE jobbus.job")


def test_one_status_lists_every_job_of_its_view_in_order_page_after_page(dsn: str) -> None:
    _fill(dsn)
    first = jobbus_json(dsn, "jobs", "list", "--status", "scheduled", "--limit", "5000")
    assert len(first) == 5000
    assert [j["next_run_at"] for j in first] == sorted(j["next_run_at"] for j in first)
    table = jobbus(dsn, "jobs", "list", "--status", "scheduled", "--limit", "5000")
    (cursor,) = [line.split("--after ", 1)[1] for line in table.stdout.splitlines() if "--after" in line]
    seen = [j["id"] for j in first]
    while cursor:
        page = jobbus(dsn, "jobs", "list", "--status", "scheduled", "--limit", "5000", "--after", cursor, "--json")
        jobs = json.loads(page.stdout)
        seen += [j["id"] for j in jobs]
        table = jobbus(dsn, "jobs", "list", "--status", "scheduled", "--limit", "5000", "--after", cursor)
        after = [line.split("--after ", 1)[1] for line in table.stdout.splitlines() if "--after" in line]
        cursor = after[0] if after else ""
    assert len(seen) == len(set(seen)) == 20_000
    # The id of the last job seen works as well as the cursor the page printed.
    by_id = jobbus_json(dsn, "jobs", "list", "--status", "scheduled", "--limit", "5", "--after", first[-1]["id"])
    assert [j["id"] for j in by_id] == seen[5000:5005]


def test_the_json_names_retrying_and_parked_jobs_and_says_when_they_run(dsn: str) -> None:
    _fill(dsn)
    retrying = jobbus_json(dsn, "jobs", "list", "--status", "retrying")
    assert len(retrying) == 3 and {j["view"] for j in retrying} == {"retrying"}
    assert all(j["status"] == "queued" and j["next_run_at"] == j["available_at"] for j in retrying)
    (parked,) = jobbus_json(dsn, "jobs", "list", "--status", "waiting")
    assert parked["view"] == "waiting" and parked["waiting_for"] == "event order:7:paid"
    assert parked["next_run_at"] is None  # a wait without a timeout has no time to show
    human = jobbus(dsn, "jobs", "list", "--status", "waiting")
    assert "waits for event order:7:paid until woken" in human.stdout and "9000" not in human.stdout
    assert "retrying" in jobbus(dsn, "jobs", "list", "--status", "retrying").stdout


def test_search_and_name_reach_every_job(dsn: str) -> None:
    _fill(dsn)
    (found,) = jobbus_json(dsn, "jobs", "list", "--status", "scheduled", "--search", "SKU-19999")
    assert found["configuration_data"] == {"sku": "sku-19999"}
    assert len(jobbus_json(dsn, "jobs", "list", "--search", "421 TRY")) == 3  # in creation order too
    (named,) = jobbus_json(dsn, "jobs", "list", "--name", "order-7")
    assert named["type"] == "flow"
    assert jobbus_json(dsn, "jobs", "list", "--status", "scheduled", "--search", "no such text") == []
