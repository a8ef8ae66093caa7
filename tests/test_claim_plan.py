"""The claim reads only jobs the worker can take: its executed plan, read through auto_explain, shows it.

Beside 10 jobs the worker can take lie jobs it cannot: in a paused queue, of a type it has no handler
for (in its own queue), scheduled for later at a higher priority, and finished. Every index scan of
the claim returns at most what it claims (plus the probe that ends a group), and nothing is read and
then filtered away.
"""

from __future__ import annotations

import os
import re
from typing import Any

import psycopg

import jobbus
from jobbus.store import MaintenanceStore, run_sync

SCALE = 200_000 if os.environ.get("JOBBUS_FULL_FAULTS") == "1" else 20_000

NOISE = f"""
INSERT INTO jobbus.job (id, type, queue, max_attempts, priority, available_at, status, finished_at)
SELECT gen_random_uuid(), kind.type, kind.queue, 3, kind.priority, now() + kind.delay, kind.status,
       CASE WHEN kind.status = 'completed' THEN now() END
FROM generate_series(1, {SCALE}),
     (VALUES ('t', 'paused', 0, interval '0', 'queued'),
             ('other', 'work', 0, interval '0', 'queued'),
             ('t', 'work', 10, interval '1 day', 'queued'),
             ('t', 'work', 0, interval '0', 'completed')) AS kind(type, queue, priority, delay, status)
"""


def _executed_plans(conn: psycopg.Connection[Any], app: jobbus.App, pairs: list[tuple[str, str]]) -> tuple[int, str]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_analyze = on", "log_level = 'notice'"):
        conn.execute(f"SET auto_explain.{setting}")
    claimed = run_sync(
        conn,
        app.store.claim_jobs(worker_id="w", limit=50, pairs=pairs, lease_seconds=60, max_payload_bytes=2**20),
    )
    conn.execute("SET auto_explain.log_min_duration = -1")
    return len(claimed), "\n".join(notices)


def test_the_claim_never_reads_jobs_the_worker_cannot_take(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(NOISE.encode())
        conn.execute(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts) "
            "SELECT gen_random_uuid(), 't', 'work', 3 FROM generate_series(1, 10)"
        )
        conn.execute("ANALYZE jobbus.job")
        pairs = run_sync(conn, MaintenanceStore(app.settings.schema).queued_pairs())
        assert sorted(pairs) == [("paused", "t"), ("work", "other"), ("work", "t")]
        # What a worker serving the queue "work" with a handler for "t" only (its pairs):
        claimed, plans = _executed_plans(conn, app, [("work", "t")])
    assert claimed == 10
    scans = re.findall(r"Index (?:Only )?Scan.*? on job .*?\(actual time=[^)]*rows=(\d+) loops=(\d+)\)", plans)
    assert scans, plans
    assert max(int(rows) * int(loops) for rows, loops in scans) <= 10, plans
    assert "Seq Scan on job" not in plans and "Bitmap Heap Scan on job" not in plans, plans
    assert _filtered_job_rows(plans) == 0, plans


def _filtered_job_rows(plans: str) -> int:
    """Rows read from the job table and then thrown away by a filter, over every executed plan."""
    thrown = 0
    node = ""
    for line in plans.splitlines():
        if "(cost=" in line:
            node = line
        match = re.search(r"Rows Removed by Filter: (\d+)", line)
        if match and " on job " in node:
            thrown += int(match[1])
    return thrown
