"""Retention deletes by primary key: the executed plans of the leader's cleaner and of `prune`, read
through auto_explain where the server has it and as generic plans on every server, never scan the
job table.

Both statements are planned without their parameters (the cleaner is a SQL function; a prepared
`prune` may take a generic plan), and a batch joined to the table by a subquery then became a hash
join over a sequential scan of every row, per batch (docs/capacity.md, retention).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import schema
from jobbus.store import MaintenanceStore, run_sync
from tests.plans import NEEDS_AUTO_EXPLAIN, auto_explained, generic_plan, sql_function_body

FINISHED = 20_000

EXPIRED = f"""
INSERT INTO jobbus.job (id, type, queue, max_attempts, status, finished_at)
SELECT gen_random_uuid(), 't', 'work', 3, 'completed', now() - interval '2 days' - make_interval(secs => n)
FROM generate_series(1, {FINISHED}) AS n
"""


def _loaded(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(EXPIRED.encode())
    conn.execute("ANALYZE jobbus.job")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    return conn


def _left(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


def _assert_deletes_by_primary_key(plans: str) -> None:
    assert "Delete on job" in plans, plans
    assert not re.search(r"Seq Scan on job(?!_)", plans), plans
    assert re.search(r"Index Scan (using|on) job_pkey", plans), plans


def _cleaners_generic_plan(conn: psycopg.Connection[Any]) -> str:
    body, types = sql_function_body(conn, "jobbus.delete_finished_jobs")
    arguments = {"p_status": "completed", "p_older_than_seconds": 86_400, "p_limit": 100}
    return generic_plan(conn, body, arguments, types)


@pytest.mark.server(NEEDS_AUTO_EXPLAIN)
def test_the_cleaners_batch_deletes_by_primary_key(dsn: str) -> None:
    store = MaintenanceStore("jobbus")
    with _loaded(dsn) as conn:
        deleted, plans = auto_explained(
            conn, lambda: run_sync(conn, store.delete_finished_jobs("completed", 86_400, 100))
        )
        left = _left(conn)
    assert deleted == 100 and left == FINISHED - 100
    _assert_deletes_by_primary_key(plans)


def test_the_cleaners_batch_deletes_by_primary_key_in_its_generic_plan(dsn: str) -> None:
    """On every server: the function's body as installed, prepared and explained."""
    with _loaded(dsn) as conn:
        plan = _cleaners_generic_plan(conn)
        left = _left(conn)
    assert left == FINISHED - 100
    _assert_deletes_by_primary_key(plan)


def test_the_generic_plan_shows_the_scan_of_the_cleaner_retention_once_had(dsn: str) -> None:
    """The check above fails on the plan it guards against: migration 0005's cleaner, which joined the
    batch to the table (`DELETE ... USING doomed`) and scanned every row per batch."""
    before = next(m for m in schema.migrations() if m.version == 5)
    function = re.search(r"CREATE FUNCTION \{schema\}\.delete_finished_jobs.*?\$\$;", before.template, re.S)
    assert function is not None
    with _loaded(dsn) as conn:
        conn.execute(function[0].replace("CREATE", "CREATE OR REPLACE", 1).replace("{schema}", "jobbus").encode())
        plan = _cleaners_generic_plan(conn)
    assert re.search(r"Seq Scan on job(?!_)", plan), plan


@pytest.mark.server(NEEDS_AUTO_EXPLAIN)
def test_a_prune_batch_deletes_by_primary_key_even_in_a_generic_plan(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    statement = app.store.prune_jobs(older_than_seconds=86_400, statuses=["completed"], limit=100)
    with _loaded(dsn) as conn:

        def prune_prepared() -> int:
            cursor = conn.execute(statement.query, statement.params, prepare=True)
            return cursor.rowcount

        deleted, plans = auto_explained(conn, prune_prepared)
    assert deleted == 100
    _assert_deletes_by_primary_key(plans)


def test_a_prune_batch_deletes_by_primary_key_in_its_generic_plan_read_by_explain(dsn: str) -> None:
    """On every server: the statement prepared and explained."""
    app = jobbus.App(dsn=dsn)
    statement = app.store.prune_jobs(older_than_seconds=86_400, statuses=["completed"], limit=100)
    with _loaded(dsn) as conn:
        plan = generic_plan(conn, statement.query, statement.params)
        left = _left(conn)
    assert left == FINISHED - 100
    _assert_deletes_by_primary_key(plan)


@pytest.mark.server(NEEDS_AUTO_EXPLAIN)
def test_the_cleaner_is_never_compiled_by_jit(dsn: str) -> None:
    """Its generic estimate over many finished rows passes the JIT thresholds; compiling a batch took
    75 times the batch's own work (migration 0018). Here every threshold is 0: a statement the session
    runs would be compiled, the cleaner's must not be."""
    with _loaded(dsn) as conn:
        available = conn.execute("SELECT pg_jit_available()").fetchone()
        if not (available and available[0]):
            pytest.skip("this server has no JIT provider")
        for setting in ("jit = on", "jit_above_cost = 0", "jit_inline_above_cost = 0", "jit_optimize_above_cost = 0"):
            conn.execute(f"SET {setting}")
        deleted, plans = auto_explained(
            conn, lambda: run_sync(conn, MaintenanceStore("jobbus").delete_finished_jobs("completed", 86_400, 100))
        )
    assert deleted == 100
    # Its own statement (the job_deleted trigger's, on small tables, are the session's to compile).
    (cleaner,) = [plan for plan in plans.split("duration:") if "Delete on job " in plan]
    assert "JIT:" not in cleaner, cleaner
