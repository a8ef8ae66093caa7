"""Retention deletes by primary key: the executed plans of the leader's cleaner and of `prune`, read
through auto_explain, never scan the job table.

Both statements are planned without their parameters (the cleaner is a SQL function; a prepared
`prune` may take a generic plan), and a batch joined to the table by a subquery then became a hash
join over a sequential scan of every row, per batch (docs/capacity.md, retention).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

import jobbus
from jobbus.store import MaintenanceStore, run_sync

FINISHED = 20_000

EXPIRED = f"""
INSERT INTO jobbus.job (id, type, queue, max_attempts, status, finished_at)
SELECT gen_random_uuid(), 't', 'work', 3, 'completed', now() - interval '2 days' - make_interval(secs => n)
FROM generate_series(1, {FINISHED}) AS n
"""


def _plans_of(conn: psycopg.Connection[Any], run: Any) -> tuple[Any, str]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_analyze = on", "log_level = 'notice'"):
        conn.execute(f"SET auto_explain.{setting}")
    result = run()
    conn.execute("SET auto_explain.log_min_duration = -1")
    return result, "\n".join(notices)


def _loaded(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(EXPIRED.encode())
    conn.execute("ANALYZE jobbus.job")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    return conn


def test_the_cleaners_batch_deletes_by_primary_key(dsn: str) -> None:
    store = MaintenanceStore("jobbus")
    with _loaded(dsn) as conn:
        deleted, plans = _plans_of(conn, lambda: run_sync(conn, store.delete_finished_jobs("completed", 86_400, 100)))
        left = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert deleted == 100 and left == (FINISHED - 100,)
    assert "Delete on job" in plans, plans
    assert not re.search(r"Seq Scan on job(?!_)", plans), plans
    assert re.search(r"Index Scan (using|on) job_pkey", plans), plans


def test_a_prune_batch_deletes_by_primary_key_even_in_a_generic_plan(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    statement = app.store.prune_jobs(older_than_seconds=86_400, statuses=["completed"], limit=100)
    with _loaded(dsn) as conn:

        def prune_prepared() -> int:
            cursor = conn.execute(statement.query, statement.params, prepare=True)
            return cursor.rowcount

        deleted, plans = _plans_of(conn, prune_prepared)
    assert deleted == 100
    assert "Delete on job" in plans, plans
    assert not re.search(r"Seq Scan on job(?!_)", plans), plans
    assert re.search(r"Index Scan (using|on) job_pkey", plans), plans
