"""The claim reads only jobs the worker can take: its executed plans, read through auto_explain, show it,
and so do the rows it reads with every statement planned generically (what the embedded server can tell).

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
import pytest

import jobbus
from jobbus.store import Claim, MaintenanceStore, Statement, run_sync
from tests.plans import NEEDS_AUTO_EXPLAIN, auto_explained, generic_plan

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


def _loaded(dsn: str) -> tuple[psycopg.Connection[Any], jobbus.App]:
    app = jobbus.App(dsn=dsn)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(NOISE.encode())
    conn.execute(
        "INSERT INTO jobbus.job (id, type, queue, max_attempts) "
        "SELECT gen_random_uuid(), 't', 'work', 3 FROM generate_series(1, 10)"
    )
    conn.execute("ANALYZE jobbus.job")
    pairs = run_sync(conn, MaintenanceStore(app.settings.schema).queued_pairs())
    assert sorted(pairs) == [("paused", "t"), ("work", "other"), ("work", "t")]
    return conn, app


def _claim(app: jobbus.App) -> Statement[Claim]:
    """What a worker serving the queue "work" with a handler for "t" only (its pairs) claims."""
    return app.store.claim_jobs(
        worker_id="w", limit=50, pairs=[("work", "t")], lease_seconds=60, max_payload_bytes=2**20
    )


@pytest.mark.server(NEEDS_AUTO_EXPLAIN)
def test_the_claim_never_reads_jobs_the_worker_cannot_take(dsn: str) -> None:
    conn, app = _loaded(dsn)
    with conn:
        claimed, plans = auto_explained(conn, lambda: run_sync(conn, _claim(app)))
    assert len(claimed.jobs) == 10
    # Actual rows per loop: an integer before PostgreSQL 18, with two decimals from 18 on.
    scans = re.findall(r"Index (?:Only )?Scan.*? on job .*?\(actual time=[^)]*rows=([\d.]+) loops=(\d+)\)", plans)
    assert scans, plans
    assert max(float(rows) * int(loops) for rows, loops in scans) <= 10, plans
    assert "Seq Scan on job" not in plans and "Bitmap Heap Scan on job" not in plans, plans
    assert _filtered_job_rows(plans) == 0, plans


#: What the claim of 10 jobs may read from the job table and its indexes, probes included (a claim
#: that walked the jobs it cannot take would read tens of thousands).
CLAIM_READS = 100


def _claim_reads(conn: psycopg.Connection[Any], app: jobbus.App) -> tuple[int, int, int, dict[str, int], str]:
    """The claim run in one transaction, every statement of its function planned generically: the job
    table's sequential scans, rows fetched by index and rows updated, the rows each index returned, and
    the outer plan (EXPLAIN cannot see into the function: what it read comes from the transaction's own
    statistics, pg_stat_xact_*)."""
    with conn.transaction():
        claim = _claim(app)
        plan = generic_plan(conn, claim.query, claim.params)
        table = conn.execute(
            "SELECT seq_scan, idx_tup_fetch, n_tup_upd FROM pg_stat_xact_user_tables"
            " WHERE relid = 'jobbus.job'::regclass"
        ).fetchone()
        indexes = conn.execute(
            "SELECT indexrelid::regclass::text, pg_stat_get_xact_tuples_returned(indexrelid) FROM pg_index"
            " WHERE indrelid = 'jobbus.job'::regclass"
        ).fetchall()
    assert table is not None
    return int(table[0]), int(table[1]), int(table[2]), {name: count for name, count in indexes if count}, plan


def test_the_claim_in_its_generic_plans_never_reads_jobs_the_worker_cannot_take(dsn: str) -> None:
    """On every server (the embedded one has no auto_explain)."""
    conn, app = _loaded(dsn)
    with conn:
        seq_scans, fetched, updated, read, plan = _claim_reads(conn, app)
    assert updated == 10, (seq_scans, fetched, read, plan)
    assert seq_scans == 0, (fetched, read, plan)
    assert fetched <= CLAIM_READS and sum(read.values()) <= CLAIM_READS, (fetched, read, plan)


def test_a_claim_that_reads_what_it_cannot_take_is_seen(dsn: str) -> None:
    """The check above fails on a claim without the index it is planned on."""
    conn, app = _loaded(dsn)
    with conn:
        conn.execute("DROP INDEX jobbus.job_queue_claim_idx")
        seq_scans, fetched, updated, read, _ = _claim_reads(conn, app)
    assert updated == 10
    assert seq_scans > 0 or fetched > CLAIM_READS or sum(read.values()) > CLAIM_READS, (seq_scans, fetched, read)


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
